"""BatchWrite on the front, with google-cloud-spanner's ``mutation_groups()``: each group is
applied atomically, with ``Send``/``Ack`` translated as in a commit, and independently of the
other groups; the response stream names every group by its index with its own status."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.rpc import code_pb2

from tests.emulator.test_front_messages import receive


def batch_write(database: Any, *groups: Any) -> dict[int, Any]:
    """Write one group per callable in ``groups``; return {group index: response}."""
    with database.mutation_groups() as mutation_groups:
        for fill in groups:
            fill(mutation_groups.group())
        responses = list(mutation_groups.batch_write())
    by_index: dict[int, Any] = {}
    for response in responses:
        for index in response.indexes:
            assert index not in by_index, f"group {index} answered twice"
            by_index[index] = response
    assert sorted(by_index) == list(range(len(groups)))  # every group answered
    return by_index


def count(database: Any, table: str) -> int:
    with database.snapshot() as snap:
        [[n]] = list(snap.execute_sql(f"SELECT COUNT(*) FROM {table}"))
    return n


def test_a_send_group_and_a_table_group_both_apply(database: Any) -> None:
    def signup(group: Any) -> None:  # related writes in one group: a parent row and its message
        group.insert(table="Users", columns=("UserId", "Name"), values=[(7, "ada")])
        group.send(queue="UserTasks", key=(7, "welcome"), payload=base64.b64encode(b"hi"))

    def sample(group: Any) -> None:
        group.send(queue="SampleQueue", key=(1,), payload="Hello")

    def plain(group: Any) -> None:
        group.insert(table="Users", columns=("UserId", "Name"), values=[(8, "bob")])

    responses = batch_write(database, signup, sample, plain)
    for response in responses.values():
        assert response.status.code == code_pb2.OK
        assert response.commit_timestamp is not None
    [row] = receive(database)
    assert row[:3] == [7, "welcome", base64.b64encode(b"hi")]
    assert receive(
        database, "SELECT Id, Payload FROM RECEIVE_SampleQueue(max_duration => '1s')"
    ) == [[1, "Hello"]]
    assert count(database, "Users") == 2


def test_an_ack_of_a_missing_message_fails_only_its_group(database: Any) -> None:
    with database.batch() as batch:
        batch.send(queue="SampleQueue", key=(1,), payload="x")

    def missing(group: Any) -> None:  # nothing of this group applies
        group.insert(table="Users", columns=("UserId", "Name"), values=[(9, "bob")])
        group.ack(queue="SampleQueue", key=(404,))

    def present(group: Any) -> None:
        group.ack(queue="SampleQueue", key=(1,))
        group.insert(table="Users", columns=("UserId", "Name"), values=[(10, "eve")])

    def tolerated(group: Any) -> None:
        group.ack(queue="SampleQueue", key=(405,), ignore_not_found=True)

    responses = batch_write(database, missing, present, tolerated)
    assert responses[0].status.code == code_pb2.NOT_FOUND
    assert "Message not found" in responses[0].status.message
    assert responses[1].status.code == code_pb2.OK
    assert responses[2].status.code == code_pb2.OK
    assert count(database, "SampleQueue") == 0
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT UserId FROM Users")) == [[10]]


def test_a_refused_group_leaves_the_others_applied(database: Any) -> None:
    def update_queue(group: Any) -> None:
        group.insert(table="Users", columns=("UserId", "Name"), values=[(1, "ada")])
        group.update(table="SampleQueue", columns=("Id", "Payload"), values=[(1, "x")])

    def unknown_queue(group: Any) -> None:
        group.send(queue="NoSuchQueue", key=(1,), payload="x")

    def duplicate(group: Any) -> None:  # the emulator's own error for a group
        group.insert(table="Users", columns=("UserId", "Name"), values=[(2, "a"), (2, "b")])

    def fine(group: Any) -> None:
        group.send(queue="SampleQueue", key=(2,), payload="y")

    responses = batch_write(database, update_queue, unknown_queue, duplicate, fine)
    assert responses[0].status.code == code_pb2.INVALID_ARGUMENT
    assert responses[1].status.code == code_pb2.NOT_FOUND
    assert responses[2].status.code == code_pb2.ALREADY_EXISTS
    assert responses[3].status.code == code_pb2.OK
    assert count(database, "Users") == 0
    with database.snapshot() as snap:
        assert list(snap.execute_sql("SELECT Id, Payload FROM SampleQueue")) == [[2, "y"]]


def test_a_dropped_database_fails_the_whole_call(database: Any) -> None:
    with database.mutation_groups() as mutation_groups:  # checks out a session first
        mutation_groups.group().send(queue="SampleQueue", key=(1,), payload="x")
        database.drop()
        with pytest.raises(gexc.NotFound):
            list(mutation_groups.batch_write())

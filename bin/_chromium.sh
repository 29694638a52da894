#!/usr/bin/env bash
# Called by bin/test: install Debian's chromium and chromedriver for the browser test
# (tests/admin/test_browser.py) when /usr/bin/chromedriver is missing and we are root.
# Nothing here downloads a browser from anywhere but the Debian archive. Never fails the run:
# without chromium the browser test skips (or fails under SQ_REQUIRE_BROWSER=1).
if [ -x /usr/bin/chromedriver ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "== chromium: /usr/bin/chromedriver missing and not root with apt-get; browser test skips"
  exit 0
fi
echo "== installing Debian chromium and chromium-driver for the browser test"
export DEBIAN_FRONTEND=noninteractive
if ! { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }; then
  echo "== chromium: apt-get install failed; the browser test will skip"
fi
exit 0

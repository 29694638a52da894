// A bulk action's progress page: post the next part at once (the form works without this).
"use strict";
{
    const form = document.getElementById("sq-bulk-continue");
    if (form) {
        form.submit();
    }
}

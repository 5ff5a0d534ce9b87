"""Schemathesis hooks of scripts/contract.sh.

JSON Schema cannot relate two values of a request, so the OpenAPI document
states these rules in its descriptions only. Each generated request is made
to keep them (and is left as generated otherwise):

- a job does not run after itself (`after[].job` is not its `name`);
- a webhook trigger maps only params the job declares
  (`triggers.webhook.params` names keys of `params`), and its
  `secondary_secret` is another secret than its `secret`;
- a backfill's `from` is not after its `to`;
- a trigger with an `Idempotency-Key` creates one run (no `count` above 1).
"""

import schemathesis

JOB_WRITES = {("POST", "/v1/jobs"), ("PUT", "/v1/jobs/{name}")}


@schemathesis.hook
def map_case(context, case):
    key = (case.operation.method.upper(), case.operation.path)
    body = case.body if isinstance(case.body, dict) else None
    if key in JOB_WRITES and body is not None:
        name = body.get("name", (case.path_parameters or {}).get("name"))
        after = body.get("after")
        if isinstance(after, list):
            body["after"] = [e for e in after if not (isinstance(e, dict) and e.get("job") == name)]
        triggers = body.get("triggers")
        webhook = triggers.get("webhook") if isinstance(triggers, dict) else None
        if isinstance(webhook, dict) and webhook.get("secondary_secret") is not None:
            if str(webhook.get("secondary_secret")).upper() == str(webhook.get("secret")).upper():
                del webhook["secondary_secret"]
        mapped = webhook.get("params") if isinstance(webhook, dict) else None
        if isinstance(mapped, dict):
            declared = body.get("params") if isinstance(body.get("params"), dict) else {}
            for name in [n for n in mapped if n not in declared]:
                del mapped[name]
    if key == ("POST", "/v1/jobs/{name}/backfill") and body is not None:
        start, end = body.get("from"), body.get("to")
        try:
            if instant(start) > instant(end):
                body["from"], body["to"] = end, start
        except (AttributeError, TypeError, ValueError):
            pass
    if key == ("POST", "/v1/jobs/{name}/trigger") and case.headers and "Idempotency-Key" in case.headers:
        if case.query:
            case.query.pop("count", None)
    return case


def instant(text):
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))

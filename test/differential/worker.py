"""A long-lived worker: runs scenarios on request, answers one JSON line each.

``python -m differential.worker stock`` never imports aliasguard (and says so
when asked to stop); ``python -m differential.worker aliasguard`` imports it first.
Requests on stdin, one JSON object a line: {"cmd": "list"}, {"cmd": "run", "id": ...,
"config": ...}, {"cmd": "bye"}. The aliasguard side applies the configuration (configs.py) around
the scenario, and a mutant (ALIASGUARD_DIFF_MUTANT) for its whole life; the stock side ignores both.
Replies go to the original stdout; anything else the process prints
goes to stderr, so it cannot corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings


def main() -> None:
    side = sys.argv[1]
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")
    ag = None
    mutant = None
    if side == "aliasguard":
        import aliasguard as ag  # noqa: F401  (the point of this side)

        from differential import configs

        mutant = configs.apply_mutant(ag)
    elif os.environ.get("ALIASGUARD") != "0":
        raise SystemExit("the stock worker must run with ALIASGUARD=0")
    import torch

    torch.set_num_threads(1)
    from differential import scenarios

    reg = scenarios.registry()

    def reply(obj: dict) -> None:
        proto.write(json.dumps(obj, default=str) + "\n")
        proto.flush()

    reply({"ready": side, "torch": torch.__version__, "mutant": mutant})

    for line in sys.stdin:
        req = json.loads(line)
        cmd = req["cmd"]
        if cmd == "list":
            reply({"scenarios": [[s.id, s.family, s.full_only, s.timeout] for s in reg.values()]})
        elif cmd == "run":
            sid = req["id"]
            t0 = time.perf_counter()
            undo = configs.apply(req.get("config", "default"), ag) if ag is not None else None
            try:
                rec = reg[sid].fn(scenarios.Context(side, ag, sid))
            except Exception as e:
                rec = {"harness_error": {"exc": type(e).__name__, "msg": str(e).splitlines()[0][:200] if str(e) else "",
                                         "where": traceback.format_exc().splitlines()[-3:]}}
            finally:
                if undo is not None:
                    undo()
            reply({"id": sid, "record": rec, "secs": round(time.perf_counter() - t0, 3)})
        elif cmd == "bye":
            reply({"aliasguard_imported": "aliasguard" in sys.modules, "side": side})
            return


if __name__ == "__main__":
    main()

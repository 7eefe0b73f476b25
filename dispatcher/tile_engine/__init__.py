"""The tile engine: sweep expansion, parallel build, isolated benchmarks.

It only expands configs and measures; codegen, build and runtime stay in the
dispatcher (one source of truth, as in CK's Tile Engine bridge):

1. `sweep.expand`   a sweep config -> validated KernelConfigs (+ what was filtered, and why)
2. `builder.build_all`   parallel builds into the build cache; never loads a library
3. `runner.benchmark`    disposable worker processes (`worker.py`) time each kernel,
                         one JSON line per measurement; crashes and hangs fail one row
4. `results`   CSV (CK's columns + status, reason) and JSON lines, appended row by row;
               winners go to the tuning database (`dispatcher.tuning`)
"""

"""python -m bench.anchors [--systems langgraph,dbos] [--backend sqlite,postgres]
[--workloads W1,W2,W3,W4,W5] [--quick] [--timeout SECONDS]"""

from .runner import main

raise SystemExit(main())

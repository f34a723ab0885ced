"""``python -m worker.lazyfs --config JSON``: one lazy image mount (see ``serve``)."""

from worker.lazyfs.serve import main

raise SystemExit(main())

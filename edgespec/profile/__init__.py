"""The pair's run-time profile on this machine: cost curves (``costs``), the draft's fit (``fit``), where
they are kept (``store``) and how a planner gets them (``attach``)."""

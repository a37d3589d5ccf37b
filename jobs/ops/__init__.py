"""The operator tools that run or read jobs: ``tune`` and ``plan`` (choosing and pricing a
configuration), ``report``, ``show``, ``export``, ``vacuum``, bulk ``submissions``, ``remote``
(a job on a Ray cluster through the Ray Jobs API: ``overnight submit``/``status``/``logs``),
``dryrun`` and ``demo``. Above the job kinds they run; nothing below imports them.
"""

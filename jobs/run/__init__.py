"""The one runner of every job and its parts: the ``Stage`` record (``stage``), the runner
(``runner``: claim, subtract done, manifest, stages, execute, repair, ledger, summary), the
Ray side of it (``execute``: Ray start-up, manifest blocks, progress, the run loop), the model
stage's committing actor (``committing``), pool sizing (``sizing``) and the console.

Imports point down only: to ``jobs.accounting``, ``jobs.dataset``, ``schemas``, ``workers``.
"""

"""Text generation for documents and transcripts: one adapter over CTranslate2 and vLLM
(``adapter``), task prompts with validated outputs and the task registry (``tasks``), and the
Ray Data worker (``worker``).

Importing this package loads nothing: the spec and the command line read the task names
(``workers.llm.tasks.registry.TASK_NAMES``) without pyarrow or an engine. CTranslate2 loads in
``load_backend`` and vLLM (with torch) only for ``backend="vllm"``.
"""

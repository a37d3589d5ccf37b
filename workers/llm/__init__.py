"""Text generation for documents and transcripts: one adapter over CTranslate2 and vLLM,
task prompts with validated outputs, and the Ray Data worker.

Importing this package loads neither engine: CTranslate2 loads in ``load_backend`` and
vLLM (with torch) only for ``backend="vllm"``.
"""

from workers.llm.adapter import load_backend
from workers.llm.contract import EngineUnavailable, Generation, GenerationParams, LLMBackend
from workers.llm.tasks import TaskInput, TaskOutput, TaskSpec, run_task
from workers.llm.worker import LLMWorker, LLMWorkerConfig

__all__ = [
    "EngineUnavailable",
    "Generation",
    "GenerationParams",
    "LLMBackend",
    "LLMWorker",
    "LLMWorkerConfig",
    "TaskInput",
    "TaskOutput",
    "TaskSpec",
    "load_backend",
    "run_task",
]

"""Judge configuration at the edges: per task key (Expectation.judge) and per service.

Pure models, no I/O imports: expectations load this without the judges' HTTP client (aiohttp).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

JudgeScorerName = Literal["trajectory_steps", "plan_adherence"]


class OpenAIJudgeConfig(BaseModel):
    """Where and how to ask; prices are per 1k tokens, in USD."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_url: str = "https://api.openai.com/v1"
    model: str = "gpt-4o-mini"
    api_key_env: str = Field(default="OPENAI_API_KEY", description="Environment variable holding the key.")
    api_key_header: str = Field(
        default="Authorization", description="`Authorization` (Bearer) or Azure's `api-key`."
    )
    query: dict[str, str] = Field(default_factory=dict, description="e.g. Azure's api-version.")
    timeout_s: float = Field(
        default=20.0, gt=0, description="One request's timeout (a whole trajectory's answers on CPU models)."
    )
    max_concurrency: int = Field(default=4, ge=1)
    max_retries: int = Field(default=3, ge=0)
    backoff_base_s: float = Field(default=0.5, ge=0)
    max_backoff_s: float = Field(default=30.0, ge=0)
    max_retry_after_s: float = Field(
        default=60.0, ge=0, description="A longer Retry-After fails fast instead of stalling scoring."
    )
    requests_per_minute: int | None = Field(default=None, ge=1)
    max_rpm_wait_s: float = Field(default=5.0, ge=0, description="Longer waits for a slot fail fast.")
    top_logprobs: int = Field(default=5, ge=1, le=20)
    decoding: Literal["auto", "gbnf", "json_schema", "none"] = Field(
        default="auto",
        description="How the answer format is guaranteed: `auto` probes the server once and sends a GBNF "
        "grammar admitting only the answer lines to llama.cpp's server (GET /models `owned_by: "
        "llamacpp`, or GET /props), a strict JSON schema of them to vLLM (`owned_by: vllm`) and OpenAI "
        "(api.openai.com), nothing otherwise (the mode chosen is logged); `gbnf` / `json_schema` "
        "always; `none` never.",
    )
    answer_grammar: bool = Field(
        default=False,
        description="Always send the GBNF grammar (the same as `decoding: gbnf`; llama.cpp's server and "
        "llama-cpp-python; OpenAI rejects the field).",
    )
    require_logprobs: bool = Field(
        default=False,
        description="An answer without logprobs is malformed (not_scored) instead of a 1.0/0.0 "
        "answer marked `answer_text`.",
    )
    max_tokens_field: str = Field(
        default="max_tokens", description="`max_completion_tokens` for newer models."
    )
    price_input_per_1k: float = Field(default=0.0, ge=0)
    price_output_per_1k: float = Field(default=0.0, ge=0)
    cache_entries: int = Field(default=10_000, ge=1)
    prompt_version: str | None = Field(
        default=None,
        description="The judge prompt to render with (evaluator/judge/prompts.yaml's `version`, or an "
        "earlier one kept in evaluator/judge/prompts/); None: the default.",
    )

    @field_validator("prompt_version")
    @classmethod
    def _a_known_version(cls, version: str | None) -> str | None:
        """A pinned version that does not exist is a config error, not a failure at first judge."""
        if version is not None:
            from .prompt import prompt_file  # the prompt files are read only when one is pinned

            prompt_file(version)
        return version


class JudgeBudget(BaseModel):
    """A daily (UTC day) cap: requests actually sent, and/or USD spent. None = no cap."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests: int | None = Field(default=None, ge=0)
    usd: float | None = Field(default=None, ge=0)


class JudgeSettings(BaseModel):
    """One task key's judge policy (the `judge:` section of an expectation)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    scorers: list[JudgeScorerName] | None = Field(
        default=None,
        description="Judge scorers to run for this task key; none runs unless named here (a plan or "
        "outcome steps alone do not turn a judge on).",
    )
    sampling_rate: float = Field(
        default=1.0, ge=0.0, le=1.0, description="Share of partitions judged, chosen by partition id hash."
    )
    daily_budget: JudgeBudget | None = None


class JudgeServiceConfig(BaseModel):
    """The service's judge: which backend, its global daily budget, and a deadline per partition."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["local", "openai"] = "local"
    openai: OpenAIJudgeConfig = Field(default_factory=OpenAIJudgeConfig)
    daily_budget: JudgeBudget | None = None
    deadline_s: float = Field(
        default=60.0,
        gt=0,
        description="A judge call slower than this is abandoned: not_scored, never a stall.",
    )
    max_pending_partitions: int = Field(
        default=1000,
        ge=1,
        description="Partitions waiting on the judge at once in the service; beyond it a partition's "
        "judge scorers give not_scored (skip reason `backlog`) instead of queueing without bound.",
    )

"""A request, planned: `GenerationRequest` (what an API asks for, as typed values) becomes a `Plan`
(the prompt's tokens, the constraint the answer follows, the drafter and the K policy) that the
worker thread (generator.py) runs. Planning reads the models (tokenizer, chat template, FIM tokens)
and the cached conversations (cache_slots.py), so it runs on the worker thread too, right before
the plan it makes; a bad request raises a `SpecggufError` here, before anything is generated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..conversation import FimRequest, Message, Prompts, fill_in_middle
from ..core.constraint import Constraint
from ..core.drafters import DRAFTER_KINDS, DrafterKind
from ..core.drafting import Drafter
from ..core.engine import KPolicy
from ..core.model import Model
from ..core.ngram_cache import SessionNgrams
from ..core.repeatable import repeatable
from ..core.sampling import SamplingSettings
from ..errors import ContextFullError, PromptError, UsageError
from ..grammar import GrammarSpec, constraint_for
from ..kchoice import KChoice
from ..prepare import Prepared
from .tool_syntax import SYNTAXES, Family
from .tools import ToolPlan, call_constraint


@dataclass(frozen=True)
class RequestPrompt:
    """What the answer follows: chat `messages`, else token ids (`tokens`), else a fill-in-the-middle
    (`fim`), else the raw `text`."""

    messages: list[Message] | None = None  # chat: rendered with the verifier's own template (or ChatML)
    text: str = ""  # completions: the raw prompt (tokenized as `run --raw` does)
    tokens: list[int] | None = None  # the prompt as token ids (then `text` is not read)
    fim: FimRequest | None = None  # fill in the middle, framed with the model's FIM tokens
    parse_special: bool = False  # `text`'s special-token texts become those tokens (llama-server's raw prompt)


@dataclass(frozen=True)
class RequestSampling:
    """How the answer's tokens are drawn, and what is said of them."""

    settings: SamplingSettings
    seed: int | None = None  # None or negative: a fresh one per request
    n_top_logprobs: int | None = None  # None: no log-probabilities; else alternatives per token


@dataclass(frozen=True)
class Limits:
    """Where the answer ends."""

    max_tokens: int
    stops: list[str] = field(default_factory=list)
    n_indent: int = 0  # FIM: stop at a later line indented less than this (llama-server's n_indent)
    t_max_predict_ms: int = 0  # FIM: past this time, stop at the next new line (0: no limit)


@dataclass(frozen=True)
class Speculation:
    """A request's own drafting (specgguf's `speculative` field; None: the server's default), and whether
    each Delta says who wrote its text (draft_marks.py)."""

    k: KChoice | None = None
    drafter: DrafterKind | None = None
    p_min: float | None = None
    mark_drafts: bool = False
    deterministic: bool | None = None  # passes of its own, K from its own tokens (None: the server's --deterministic)


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate, as typed values: each API builds it once from its validated body."""

    prompt: RequestPrompt
    sampling: RequestSampling
    limits: Limits
    speculation: Speculation = Speculation()
    grammar: GrammarSpec | None = None  # what the answer must follow (response_format, grammar), compiled once already
    tools: ToolPlan | None = None  # the chat request's tools (tools.py): in the prompt, and what a call follows


@dataclass(frozen=True)
class Plan:
    """A request made ready to run."""

    request: GenerationRequest
    prompt: list[int]  # the prompt's tokens: its whole text tokenized fresh (or the request's ids, or FIM's)
    constraint: Constraint | None  # the grammar (response_format, grammar) or the tool calls' lazy one
    drafter: Drafter | None
    policy: KPolicy
    deterministic: bool = False  # the request's passes are its own, its prompt read whole (serve --deterministic)


class Planner:
    """Plans requests against the loaded pair and the server's drafting defaults."""

    def __init__(self, *, prepared: Prepared, templates: Prompts, tool_family: Family, deterministic: bool = False):
        self.prepared, self.deterministic = prepared, deterministic
        self.verifier, self.draft, self.defaults = prepared.verifier, prepared.draft, prepared.options
        self.templates, self.tool_family = templates, tool_family
        self._policies: dict[tuple, tuple[KPolicy, object]] = {}  # adaptive policies keep learning

    def plan(self, request: GenerationRequest) -> Plan:
        """The prompt's tokens, constraint, drafter and K policy; a bad request raises. The policy is the
        first live sequence's (a server of one); under serve --parallel `on_lane` gives the lane's."""
        if request.prompt.tokens is not None:
            prompt = list(request.prompt.tokens)
        elif request.prompt.fim is not None:
            prompt = self._fim_prompt(request)
        else:
            prompt = self._prompt_tokens(request)  # fresh, whatever came before
        self._check_token_ids(request, prompt)
        if not prompt:
            raise PromptError("the prompt is empty")
        if len(prompt) >= self.verifier.n_ctx:
            raise ContextFullError(
                f"the prompt is {len(prompt)} tokens but the context holds"
                f" {self.verifier.n_ctx}; shorten it (or start the server with a larger -c)"
            )
        constraint: Constraint | None
        if request.tools is not None:
            constraint = call_constraint(self.verifier, request.tools, SYNTAXES[self.tool_family])
        else:
            constraint = None if request.grammar is None else constraint_for(self.verifier, request.grammar)
        deterministic = (
            self.deterministic if request.speculation.deterministic is None else request.speculation.deterministic
        )
        drafter = self._drafter(request, fresh=deterministic)
        policy = self._policy(request, 0, deterministic=deterministic)
        return Plan(request, prompt, constraint, drafter, policy, deterministic)

    def on_lane(self, plan: Plan, lane: int, draft: Model | None) -> Plan:
        """The plan for the live sequence `lane` (serve --parallel) it runs on: its drafter over `draft`
        (the lane's view of the draft model) and the lane's adaptive policy. A lane is one conversation
        at a time (an editor's completions, a chat's turns take the lane they continue: parallel/lanes.py),
        so its policy goes on learning what the last requests there taught it, as one server's does."""
        drafter = None if plan.drafter is None else self._drafter(plan.request, draft, fresh=plan.deterministic)
        return replace(plan, drafter=drafter, policy=self._policy(plan.request, lane, deterministic=plan.deterministic))

    def _kind(self, request: GenerationRequest) -> DrafterKind:
        return request.speculation.drafter or self.defaults.drafter

    def _drafter(
        self, request: GenerationRequest, draft: Model | None = None, *, fresh: bool = False
    ) -> Drafter | None:
        """The request's drafter, over `draft` if given (a live sequence's view), else the draft model.
        A seeded request (and a `fresh` one: deterministic) drafts without what earlier requests taught
        the n-gram cache: the same drafts consume the same random numbers, so the same seed gives the
        same answer, and the same drafts make the same verify passes."""
        wanted = request.speculation
        p_min = self.defaults.p_min if wanted.p_min is None else wanted.p_min
        session = SessionNgrams() if fresh or request.sampling.seed is not None else None
        return self.prepared.drafter(self._kind(request), p_min=p_min, session=session, draft=draft)

    def _fim_prompt(self, request: GenerationRequest) -> list[int]:
        framing = self.verifier.fim_tokens()
        if framing is None:
            raise PromptError(
                "this model has no fill-in-the-middle tokens (FIM prefix/suffix/middle): infill needs"
                " a code model that has them, such as Qwen2.5-Coder"
            )
        assert request.prompt.fim is not None
        return fill_in_middle(
            self.templates, request.prompt.fim, framing, n_ctx=self.verifier.n_ctx, n_predict=request.limits.max_tokens
        )

    def _check_token_ids(self, request: GenerationRequest, prompt: list[int]) -> None:
        n_vocab = self.verifier.n_vocab
        if request.prompt.tokens is not None and (bad := [t for t in prompt if t >= n_vocab]):
            raise UsageError(f"prompt: token id {bad[0]} is not in the model's vocabulary ({n_vocab} tokens)")
        if bad := [token for token, _ in request.sampling.settings.penalties.bias if token >= n_vocab]:
            raise UsageError(f"logit_bias: token id {bad[0]} is not in the model's vocabulary ({n_vocab} tokens)")

    def _prompt_tokens(self, request: GenerationRequest) -> list[int]:
        """A text prompt's tokens: a completions prompt is the model's raw input, its `<|fim_prefix|>`
        the FIM token, as llama-server reads it (`parse_special`). A chat's: the template's special
        tokens parsed, never those in the messages (conversation.Prompts.chat_tokens)."""
        prompt = request.prompt
        if prompt.messages is None:
            return self.templates.tokens(prompt.text, special=prompt.parse_special)
        tools = None if request.tools is None else request.tools.in_prompt
        return self.templates.chat_tokens(prompt.messages, tools)  # a failing or looping template: PromptError

    def _choice(self, request: GenerationRequest, kind: DrafterKind) -> KChoice:
        """The request's K (its own, else the server's); without a draft model, a drafter that needs one
        is refused if the request asked for it, else off (K 0)."""
        wanted = request.speculation
        choice = wanted.k or self.defaults.k
        if DRAFTER_KINDS[kind].needs_model and self.draft is None and not (choice.mode == "fixed" and choice.k == 0):
            if wanted.drafter is not None or wanted.k is not None:
                raise UsageError(
                    f"drafter {kind!r} needs a draft model, and this server has none loaded (start"
                    ' it with -md or --pair, or ask for "drafter": "ngram" or "k": 0)'
                )
            return KChoice("fixed", 0)
        return choice

    def _policy(self, request: GenerationRequest, lane: int, *, deterministic: bool) -> KPolicy:
        """The request's K policy, the server's default overridden per request: an adaptive one is the one
        live sequence `lane` has kept learning (made on first use). A deterministic request's is its own,
        new, and timed by the machine's costs (core/repeatable.py): its K follows from its tokens alone,
        not from earlier requests or the clock."""
        kind = self._kind(request)
        choice = self._choice(request, kind)
        settings = request.sampling.settings
        if choice.mode == "fixed" or deterministic:  # a fixed K as `run -k N`; a deterministic request's own
            policy = self.prepared.policy(choice, temperature=settings.temperature, drafter=kind)[0]
            return repeatable(policy, lambda: self.prepared.costs) if deterministic else policy
        key = (choice.mode, kind, settings.greedy, lane)
        if key not in self._policies:
            self._policies[key] = self.prepared.policy(choice, temperature=settings.temperature, drafter=kind)
        return self._policies[key][0]

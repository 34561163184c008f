"""Read by mypy only (`make lint`), never run: each function below type-checks only if its
argument satisfies the engine's protocol, so a fake or a real implementation drifting
from `engine.Model`, `drafting.Drafter` or `engine.KPolicy` fails the lint, not a user."""

from __future__ import annotations

from fakes import FakeModel
from specgguf.core.drafters import HybridDrafter
from specgguf.core.drafting import Drafter, NoDrafter
from specgguf.core.engine import FixedK, KPolicy, Model
from specgguf.core.kpolicy import AdaptiveK, PerSource
from specgguf.core.lane_policy import LaneSequence, SharedCosts
from specgguf.core.model_drafter import ModelDrafter
from specgguf.core.ngram_drafter import NgramDrafter
from specgguf.llama.batcher import Decoder, SequenceView
from specgguf.llama.loaded import LoadedModel
from specgguf.llama.model import LlamaModel
from specgguf.llama.sequences import DecodeContext, LlamaDecoder
from test_parallel_laws import FakeContext


def fake_model_is_a_model(model: FakeModel) -> Model:
    return model


def llama_model_is_a_model(model: LlamaModel) -> Model:
    return model


def sequence_view_is_a_model(model: SequenceView) -> Model:
    return model


def sequence_view_is_a_lane_sequence(view: SequenceView) -> LaneSequence:
    return view  # what a lane's policy reads of it (core/lane_policy.py)


def llama_decoder_is_a_decoder(decoder: LlamaDecoder) -> Decoder:
    return decoder


def llama_model_is_a_decode_context(model: LlamaModel) -> DecodeContext:
    return model  # what LlamaDecoder decodes with: named, no private member


def fake_context_is_a_decoder(decoder: FakeContext) -> Decoder:
    return decoder


def model_drafter_is_a_drafter(drafter: ModelDrafter) -> Drafter:
    return drafter


def ngram_drafter_is_a_drafter(drafter: NgramDrafter) -> Drafter:
    return drafter


def no_drafter_is_a_drafter(drafter: NoDrafter) -> Drafter:
    return drafter


def hybrid_drafter_is_a_drafter(drafter: HybridDrafter) -> Drafter:
    return drafter


def fixed_k_is_a_policy(policy: FixedK) -> KPolicy:
    return policy


def adaptive_k_is_a_policy(policy: AdaptiveK) -> KPolicy:
    return policy


def per_source_is_a_policy(policy: PerSource) -> KPolicy:
    return policy


def shared_costs_is_a_policy(policy: SharedCosts) -> KPolicy:
    return policy  # a lane's policy among the live requests' (serve --parallel)


def llama_model_is_a_loaded_model(model: LlamaModel) -> LoadedModel:
    return model


def a_loaded_model_is_a_model(model: LoadedModel) -> Model:
    return model

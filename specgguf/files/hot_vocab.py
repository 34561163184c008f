"""A hot-vocabulary draft: a copy of a draft GGUF whose vocabulary is cut to its H most frequent tokens.

A small draft spends a large share of each token on its output head (151,936 rows for Qwen2.5),
yet almost every right draft is one of a few tens of thousands of tokens. A draft that scores only
those stays lossless: a token it cannot propose has q = 0, and the verifier still supplies it
(FR-Spec, VocabTrim; SGLang ships it as a token map).

- Which tokens: the special tokens, then the tokens the verifier itself wrote on a calibration set
  (code and prose, drafts/made.py), most frequent first, then the lowest ids: a BPE vocabulary's
  ids follow its merge order, the tokenizer's own frequency ranking on its training corpus. (By id
  alone, Qwen2.5's 32k cut lacks "```", which opens every code answer.)
- The file: the same GGUF (gguf-py reads and writes it, tensors copied byte for byte) with
  `token_embd.weight` and `output.weight` cut to the kept rows, the token list, types and scores
  cut alike, and every `tokenizer.ggml.*_token_id` renumbered.
- Beside it, `<file>.ids.npz`: `ids` (draft id -> verifier id), `feed` (verifier id -> the draft
  id it is read as) and `row_type`; and `<file>.rows.npy`, the source's whole token embedding as
  stored (quantized rows, memory-mapped). A token outside the hot set that appears in the context
  is fed as its own embedding row through `llama_batch.embd` (`EmbeddingRows`), so the draft reads
  the text as it is. Where a model cannot take embeddings (a tree's batch), it is read as the hot
  token whose text is its longest prefix (" configuration" as " config"), else the first kept token:
  a near-miss, which costs acceptance there, never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError
from .partial import partial_file

CONTROL_TYPES = (2, 3, 4, 5)  # unknown, control, user-defined, unused: kept whatever their id
CUT_TENSORS = ("token_embd.weight", "output.weight")
MIN_ROWS = 1024


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".ids.npz")


def rows_file(path: Path) -> Path:
    return path.with_name(path.name + ".rows.npy")


def hot_ids(token_types: np.ndarray, n_hot: int, counts: np.ndarray | None = None) -> np.ndarray:
    """The kept verifier ids, sorted: every special token, then the tokens `counts` saw (most often
    first), then the lowest ids, up to n_hot in all."""
    special = np.flatnonzero(np.isin(token_types, CONTROL_TYPES))
    order = np.arange(len(token_types))
    if counts is not None:
        seen = np.flatnonzero(counts > 0)
        seen = seen[np.argsort(-counts[seen], kind="stable")]
        order = np.concatenate([seen, np.setdiff1d(order, seen)])
    rest = order[~np.isin(order, special)][: max(0, n_hot - len(special))]
    return np.union1d(special, rest).astype(np.int64)


@dataclass(frozen=True)
class HotMaps:
    ids: np.ndarray  # draft id -> verifier id
    feed: np.ndarray  # verifier id -> the draft id it is read as where no embedding row can be fed
    rows: EmbeddingRows | None  # the whole vocabulary's input embedding (None: a map from before it)


class EmbeddingRows:
    """The source draft's token embedding, every row, read from a memory map and dequantized on demand
    (gguf-py's own dequantizers): what a cold token in the context is fed as."""

    def __init__(self, path: Path, row_type: int):
        import gguf

        try:
            self._raw = np.load(path, mmap_mode="r", allow_pickle=False)
            self._type = gguf.GGMLQuantizationType(row_type)
        except (OSError, ValueError) as error:
            raise ModelLoadError(f"{path}: not an embedding table ({error}); delete it to rebuild") from None
        self._dequantize = gguf.quants.dequantize
        block, block_bytes = gguf.GGML_QUANT_SIZES[self._type]
        if self._raw.ndim != 2 or self._raw.dtype != np.uint8 or self._raw.shape[1] % block_bytes:
            raise ModelLoadError(f"{path}: not an embedding table (shape {self._raw.shape}); delete it to rebuild")
        self.n_vocab = self._raw.shape[0]
        self.n_embd = self._raw.shape[1] // block_bytes * block  # the width of a dequantized row

    def __call__(self, tokens: list[int]) -> np.ndarray:
        """float32 rows, one per token, in order."""
        return np.ascontiguousarray(self._dequantize(self._raw[np.asarray(tokens)], self._type), dtype=np.float32)


def feed_map(tokens: list[str], ids: np.ndarray) -> np.ndarray:
    """verifier id -> draft id: its own where kept, else the kept token that is its longest prefix."""
    position = {tokens[i]: d for d, i in enumerate(ids.tolist())}
    feed = np.zeros(len(tokens), dtype=np.int64)
    longest = max(len(text) for text in position)
    for token, text in enumerate(tokens):
        draft_id = position.get(text)
        cut = min(len(text) - 1, longest)
        while draft_id is None and cut > 0:
            draft_id = position.get(text[:cut])
            cut -= 1
        feed[token] = 0 if draft_id is None else draft_id
    return feed


def build(source: Path, destination: Path, *, n_hot: int, counts: np.ndarray | None = None) -> Path:
    """Write the hot-vocabulary copy of `source` as `destination` (its id maps and whole embedding
    table beside it), through partial files renamed at the end (none is left when it fails: a full
    disk is an error naming the file and the disk); `counts[token]`: how often the verifier wrote
    each token on the calibration set (None: by id alone)."""
    import gguf  # read and written with llama.cpp's own GGUF library

    reader = gguf.GGUFReader(str(source))
    fields = reader.fields
    try:
        tokens = [str(t) for t in fields["tokenizer.ggml.tokens"].contents()]
        types = np.asarray(fields["tokenizer.ggml.token_type"].contents(), dtype=np.int64)
        arch = str(fields["general.architecture"].contents())
    except KeyError as missing:
        raise ModelLoadError(f"{source.name}: no {missing} in its metadata; a hot vocabulary needs it") from None
    if n_hot < MIN_ROWS or n_hot >= len(tokens):
        raise ModelLoadError(f"{source.name}: a hot vocabulary of {n_hot} of {len(tokens)} tokens makes no sense")
    if counts is not None and len(counts) != len(tokens):
        counts = None  # counted in another vocabulary: by id alone
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        raise ModelLoadError(f"{source.name}: no token_embd.weight tensor; a hot vocabulary needs it")
    ids = hot_ids(types, n_hot, counts)
    # Each file through a partial of its own (files/partial.py), each written where its own partial
    # is the innermost (so an error names that file); the model is renamed last, so that a model
    # under its name always has its maps and table beside it.
    with partial_file(destination) as partial:
        _write_cut(reader, partial, arch, ids)
        with partial_file(rows_file(destination)) as partial_table:
            with partial_table.open("wb") as table:  # rows as stored, as bytes
                np.save(table, np.ascontiguousarray(embedding.data).view(np.uint8))
            with partial_file(sidecar(destination)) as partial_maps, partial_maps.open("wb") as maps:
                np.savez(maps, ids=ids, feed=feed_map(tokens, ids), row_type=int(embedding.tensor_type))
    return destination


def _write_cut(reader, path: Path, arch: str, ids: np.ndarray) -> None:
    """The source's GGUF as `path`, its vocabulary cut to `ids` (tensors, token lists, special ids)."""
    import gguf

    renumber = {int(old): new for new, old in enumerate(ids.tolist())}
    writer = gguf.GGUFWriter(str(path), arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = [value[i] for i in ids.tolist()]
        elif field.name.startswith("tokenizer.ggml.") and field.name.endswith("_token_id"):
            if int(value) not in renumber:
                continue  # a special id outside the vocabulary it names: left out, as llama.cpp would ignore it
            value = renumber[int(value)]
        elif field.name == f"{arch}.vocab_size":
            value = len(ids)
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    tensors = [(t, t.data[ids] if t.name in CUT_TENSORS else t.data) for t in reader.tensors]
    for tensor, data in tensors:
        writer.add_tensor_info(tensor.name, data.shape, data.dtype, data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data in tensors:
        writer.write_tensor_data(np.ascontiguousarray(data), tensor_endianess=reader.endianess)
    writer.close()


def load_maps(path: Path) -> HotMaps | None:
    """The maps of a hot-vocabulary draft, None for any other file; a damaged map is refused."""
    maps = sidecar(path)
    if not maps.is_file():
        return None
    try:
        with np.load(maps, allow_pickle=False) as data:
            ids, feed = np.asarray(data["ids"], dtype=np.int64), np.asarray(data["feed"], dtype=np.int64)
            row_type = int(data["row_type"]) if "row_type" in data.files else None
    except (OSError, KeyError, ValueError, TypeError) as error:
        raise ModelLoadError(f"{maps}: not a hot-vocabulary map ({error}); delete it to rebuild") from None
    if ids.ndim != 1 or feed.ndim != 1 or not len(ids) or ids.min() < 0 or ids.max() >= len(feed):
        raise ModelLoadError(f"{maps}: its ids do not fit its vocabulary; delete it to rebuild")
    if feed.min() < 0 or feed.max() >= len(ids):
        raise ModelLoadError(f"{maps}: its feed map points outside the hot vocabulary; delete it to rebuild")
    rows = None
    if row_type is not None and rows_file(path).is_file():
        rows = EmbeddingRows(rows_file(path), row_type)
        if rows.n_vocab != len(feed):
            raise ModelLoadError(f"{rows_file(path)}: {rows.n_vocab} rows for {len(feed)} tokens; delete it to rebuild")
    return HotMaps(ids, feed, rows)

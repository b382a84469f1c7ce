"""The one global stream of windows of a data folder, its resume record, batch digests, and the
held-out validation windows.

The stream is a pure function of ``(manifest, seed, seq_len)`` and does not depend on
how many ranks read it, so one machine can rebuild exactly what any rank of a cluster
saw. Every random choice comes from ``PhiloxStream`` and is made with integer
arithmetic; names are hashed with SHA-256 (never Python's ``hash()``).

The data folder (manifest, shards, held-out documents, weights) is defined in
``manifest``.

The stream (the definition)
---------------------------
Sources ``s = 0 .. S-1`` in manifest order, with reduced units ``w_s``, cumulative
``C_s = w_0 + ... + w_s``, ``W = C_{S-1}``, ``N_s`` training documents, and
``name_sha_s = SHA-256(UTF-8 name)`` (32 raw bytes).

1. Mix. ``mix = PhiloxStream(seed, "lockstep.data.mix")``. Document ``g`` (g = 0, 1,
   ...) of the stream comes from the source ``s`` with ``C_{s-1} <= t < C_s``, where
   ``u = mix[2g] * 2**32 + mix[2g+1]`` (a 64-bit integer) and
   ``t = floor(u * W / 2**64)``.
2. Per source. If ``c`` documents of source ``s`` came before document ``g``, it
   takes the source's document number ``c``: epoch ``e = c // N_s``, position
   ``j = c % N_s`` in that epoch's order. A source that runs out simply goes on with
   its next epoch, each epoch in a new order.
3. Epoch order of source ``s``: shards in the order ``keyed_permutation(
   PhiloxStream(seed, "lockstep.data.shard-order", name_sha_s, e), n_shards)``; the
   training documents of shard ``k`` (``k`` = its index in the manifest list) in the
   order ``keyed_permutation(PhiloxStream(seed, "lockstep.data.doc-order", name_sha_s,
   e, k), t_k)``; the epoch order is these document lists concatenated. (With no
   validation documents ``t_k = d_k``: the stream of a version-1 manifest.)
   ``keyed_permutation(stream, n)`` sorts ``0 .. n-1`` by the 64-bit key
   ``stream[2i] * 2**32 + stream[2i+1]`` ascending, ties by index.
4. Documents are joined in stream order, each followed by the tokenizer's ``eod_id``,
   into one flat buffer ``B``. Window ``m`` is ``B[m*(L+1) : (m+1)*(L+1)]`` with
   ``L = seq_len``: consecutive, non-overlapping, cut from the front.
5. Steps and ranks. Training step ``t`` takes the consecutive windows
   ``first_window .. first_window + n_windows - 1`` of ``schedule.plan_step(tcfg,
   seq_len, t)`` (the batch ramp decides ``n_windows``), cut into micro-batches of
   ``micro_batch`` windows in order (``spec.tree.micro_batch_bounds``; the last may be
   shorter). Every rank reads all of the step's windows (the batch digest covers the
   whole step) and computes the contiguous range of micro-batches that
   ``train.collectives.rank_micro_batches`` gives it. Nothing in steps 1-4 depends on
   ``R``.

Resume record (``GlobalStream.state_at(m)``, plain JSON)::

    {"format": "lockstep.data-stream-state", "version": 1,
     "manifest_sha256": HEX, "seed": seed, "seq_len": L,
     "window": m, "token": m*(L+1),
     "mix_counter": g,            # documents wholly or partly in windows < m
     "sources": [{"name": ..., "documents_consumed": c_s, "epoch": c_s // N_s,
                  "position_in_epoch": c_s % N_s}, ...],   # manifest order, sum c_s = g
     "partial_document": {"source": name, "document": index in source,
                          "tokens_done": k}}

Document ``g`` is the one window ``m`` starts in; its first ``k`` tokens (0 <= k <=
its length; the separator is the last token) went to earlier windows. That is the
whole partial-window buffer: windows are cut from a flat buffer, so nothing else
carries over. The record names no rank.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from lockstep.spec.philox import PhiloxStream, keyed_permutation, philox4x32

from .manifest import DataError, Manifest, Source, expect_int, expect_keys

STATE_FORMAT = "lockstep.data-stream-state"
STATE_VERSION = 1

MIX_PURPOSE = "lockstep.data.mix"
SHARD_ORDER_PURPOSE = "lockstep.data.shard-order"
DOC_ORDER_PURPOSE = "lockstep.data.doc-order"

BATCH_DIGEST_DOMAIN = b"lockstep.batch-digest.v1\x00"

_U32 = np.uint64(32)


# ---------------------------------------------------------------------------------
# Permutations and the mix: the integer arithmetic of the stream
# ---------------------------------------------------------------------------------




def stream_values(streams: list[PhiloxStream], count: int) -> np.ndarray:
    """Values ``0 .. count-1`` of several streams at once: uint32 (len(streams), count).

    Row i equals ``streams[i].uint32(0, count)``; one broadcast ``philox4x32`` call
    over the streams' keys, with the counter layout of ``PhiloxStream.blocks``."""
    n_blocks = (count + 3) // 4
    b = np.arange(n_blocks, dtype=np.uint64)
    ctr = np.empty((len(streams), n_blocks, 4), dtype=np.uint32)
    ctr[:, :, 0] = (b & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    ctr[:, :, 1] = (b >> _U32).astype(np.uint32)
    ctr[:, :, 2] = np.array([s.nonce[0] for s in streams], dtype=np.uint32)[:, None]
    ctr[:, :, 3] = np.array([s.nonce[1] for s in streams], dtype=np.uint32)[:, None]
    keys = np.stack([s.key for s in streams]).astype(np.uint32)[:, None, :]
    return philox4x32(ctr, keys).reshape(len(streams), -1)[:, :count]


def keyed_permutations(streams: list[PhiloxStream], n: int) -> np.ndarray:
    """``keyed_permutation`` of each stream: int64 (len(streams), n)."""
    if n == 0:
        return np.zeros((len(streams), 0), dtype=np.int64)
    u = stream_values(streams, 2 * n).astype(np.uint64)
    keys = (u[:, 0::2] << _U32) | u[:, 1::2]
    return np.argsort(keys, axis=1, kind="stable").astype(np.int64)


def mix_sources(mix: PhiloxStream, cumulative: np.ndarray, first_doc: int, count: int) -> np.ndarray:
    """Source index of documents ``first_doc .. first_doc+count-1``: int64 (count,).

    ``u = mix[2g] * 2**32 + mix[2g+1]``, ``t = floor(u * W / 2**64)`` computed exactly in
    64-bit halves: ``t = (hi*W + ((lo*W) >> 32)) >> 32`` (with W < 2**32 nothing
    overflows, and flooring in two steps equals flooring once). The source is the
    number of cumulative totals ``C_s <= t``.
    """
    u = mix.uint32(2 * first_doc, 2 * count).astype(np.uint64)
    total = cumulative[-1]
    t = (u[0::2] * total + ((u[1::2] * total) >> _U32)) >> _U32
    return np.searchsorted(cumulative, t, side="right").astype(np.int64)


# ---------------------------------------------------------------------------------
# The global stream
# ---------------------------------------------------------------------------------

PLAN_CHUNK = 1024  # documents planned at once; an implementation detail, not part of the stream
_EPOCH_CACHE = 16  # source epochs whose order is kept in memory
_SHARD_PERM_CACHE = 4  # shard document orders kept per epoch
_CHUNK_CACHE = 8  # planned chunks kept in memory


class _EpochOrder:
    """Step 3 for one (source, epoch), built lazily: the shard order at once, each
    shard's document order when a position inside it is first asked for. Memory is
    O(shards + documents of the shards in use), not O(documents of the source)."""

    def __init__(self, seed: int, src: Source, bases: np.ndarray, training: np.ndarray, epoch: int):
        self.seed, self.src, self.bases, self.training, self.epoch = seed, src, bases, training, epoch
        self.shard_order = keyed_permutation(
            PhiloxStream(seed, SHARD_ORDER_PURPOSE, src.name_sha256, epoch), len(src.shards)
        )
        counts = training[self.shard_order]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # epoch position of each block
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    def _shard_docs(self, k: int) -> np.ndarray:
        if k in self._perms:
            self._perms.move_to_end(k)
        else:
            stream = PhiloxStream(self.seed, DOC_ORDER_PURPOSE, self.src.name_sha256, self.epoch, k)
            self._perms[k] = self.bases[k] + keyed_permutation(stream, int(self.training[k]))
            while len(self._perms) > _SHARD_PERM_CACHE:
                self._perms.popitem(last=False)
        return self._perms[k]

    def documents(self, j: np.ndarray) -> np.ndarray:
        """Document ids at ascending epoch positions ``j``: int64."""
        out = np.empty(j.shape[0], dtype=np.int64)
        block = np.searchsorted(self.starts, j, side="right") - 1
        cuts = np.flatnonzero(np.diff(block)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), j.shape[0]]):
            p = int(block[a])
            out[a:b] = self._shard_docs(int(self.shard_order[p]))[j[a:b] - self.starts[p]]
        return out


@dataclass
class _Chunk:
    """Documents ``c*G .. c*G+G-1`` of the stream (G = PLAN_CHUNK)."""

    index: int
    token_start: int  # buffer position of the chunk's first document
    consumed: np.ndarray  # documents taken from each source before the chunk (S,)
    src: np.ndarray  # source of each document (G,)
    doc: np.ndarray  # document id within its source (G,)
    ends: np.ndarray  # buffer position just past each document's separator (G,)

    def doc_start(self, i: int) -> int:
        return self.token_start if i == 0 else int(self.ends[i - 1])


class GlobalStream:
    """Window ``m`` of the one global token stream of ``(manifest, seed, seq_len)``.

    The definition is in the module docstring. ``windows(start, count)`` returns int32
    ``(count, seq_len + 1)``.

    Cost. Reaching window ``m`` with no record is one pass over the lengths of the
    documents before it: per document two Philox values for the mix and a few integer
    operations (vectorised in chunks of ``PLAN_CHUNK`` documents), plus, per source
    epoch begun, a permutation of its shards and of each shard's documents as the
    stream enters them (O(documents of the shard)). No token is read or copied until
    a window is returned. From a resume record (``from_state``) it costs one chunk of
    that work. The stream remembers every chunk boundary it passed (one small record per
    ``PLAN_CHUNK`` documents), so reading windows in order costs O(1) planning per
    document. Memory: document lengths as int32 (4 bytes per document) plus the
    permutations of the shards in use.

    Only positions at or after a resume record's window rely on the record; the record is
    checked against the mix, the manifest digest, the seed and seq_len, but, like a
    checkpoint, it is trusted for the rest (the batch digests of the trajectory catch a
    forged one).
    """

    def __init__(self, manifest: Manifest, seed: int, seq_len: int):
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
            raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or int(seq_len) < 1:
            raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
        self.manifest = manifest
        self.seed = int(seed)
        self.seq_len = int(seq_len)
        self.window_tokens = self.seq_len + 1
        self.eod_id = manifest.eod_id
        srcs = manifest.sources
        self._S = len(srcs)
        self._cum = np.cumsum([s.units for s in srcs]).astype(np.uint64)
        self._n_docs = [s.training_documents for s in srcs]
        self._training = [manifest.shard_training_counts(i) for i in range(self._S)]
        self._mix = PhiloxStream(self.seed, MIX_PURPOSE)
        # document lengths with the separator; int32 keeps this pass-over-lengths table small
        self._lengths = [(manifest.document_lengths(i) + 1).astype(np.int32) for i in range(self._S)]
        self._epochs: OrderedDict[tuple[int, int], _EpochOrder] = OrderedDict()
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()
        # Known chunk boundaries: chunk index -> (token_start, consumed per source).
        self._bounds: dict[int, tuple[int, np.ndarray]] = {0: (0, np.zeros(self._S, dtype=np.int64))}
        self._bound_keys: list[int] = [0]  # sorted; token starts rise with the chunk index
        self._bound_starts: list[int] = [0]

    # -- the definition, piece by piece -------------------------------------------------

    def epoch_order(self, si: int, epoch: int) -> np.ndarray:
        """All document ids of source ``si`` in the order of ``epoch`` (step 3): int64 (N_s,)."""
        order = self._epoch(si, epoch)
        return order.documents(np.arange(self._n_docs[si], dtype=np.int64))

    def _epoch(self, si: int, epoch: int) -> "_EpochOrder":
        key = (si, int(epoch))
        if key in self._epochs:
            self._epochs.move_to_end(key)
        else:
            self._epochs[key] = _EpochOrder(self.seed, self.manifest.sources[si], self.manifest.shard_bases(si),
                                            self._training[si], int(epoch))
            while len(self._epochs) > _EPOCH_CACHE:
                self._epochs.popitem(last=False)
        return self._epochs[key]

    def _small_source_orders(self, si: int, epochs: list[int]) -> np.ndarray:
        """Whole epoch orders of a source, for many epochs at once: (len(epochs), N_s).
        Used when one chunk runs through more than two epochs of a source, so the
        source has fewer documents than a chunk and this stays small."""
        src = self.manifest.sources[si]
        shard_order = keyed_permutations(
            [PhiloxStream(self.seed, SHARD_ORDER_PURPOSE, src.name_sha256, e) for e in epochs], len(src.shards)
        )
        base = self.manifest.shard_bases(si)
        training = self._training[si]
        doc_orders = [
            base[k]
            + keyed_permutations(
                [PhiloxStream(self.seed, DOC_ORDER_PURPOSE, src.name_sha256, e, k) for e in epochs], int(training[k])
            )
            for k in range(len(src.shards))
        ]
        out = np.empty((len(epochs), src.training_documents), dtype=np.int64)
        for row in range(len(epochs)):
            out[row] = np.concatenate([doc_orders[k][row] for k in shard_order[row].tolist()])
        return out

    def _plan(self, c: int, token_start: int, consumed: np.ndarray) -> _Chunk:
        G = PLAN_CHUNK
        src = mix_sources(self._mix, self._cum, c * G, G)
        doc = np.empty(G, dtype=np.int64)
        length = np.empty(G, dtype=np.int64)
        for s in range(self._S):
            idx = np.flatnonzero(src == s)
            if idx.size == 0:
                continue
            pos = int(consumed[s]) + np.arange(idx.size, dtype=np.int64)
            n = self._n_docs[s]
            ep, j = pos // n, pos % n
            e0, e1 = int(ep[0]), int(ep[-1])
            if e1 - e0 >= 2:
                doc[idx] = self._small_source_orders(s, list(range(e0, e1 + 1)))[ep - e0, j]
            else:
                for e in range(e0, e1 + 1):
                    sel = ep == e
                    doc[idx[sel]] = self._epoch(s, e).documents(j[sel])
            length[idx] = self._lengths[s][doc[idx]]
        ends = token_start + np.cumsum(length)
        return _Chunk(c, token_start, consumed.copy(), src, doc, ends)

    def _add_bound(self, c: int, token_start: int, consumed: np.ndarray) -> None:
        if c not in self._bounds:
            self._bounds[c] = (int(token_start), consumed.copy())
            at = bisect.bisect_left(self._bound_keys, c)
            self._bound_keys.insert(at, c)
            self._bound_starts.insert(at, int(token_start))

    def _chunk(self, c: int) -> _Chunk:
        if c in self._chunks:
            self._chunks.move_to_end(c)
            return self._chunks[c]
        if c not in self._bounds:
            prev = self._bound_keys[bisect.bisect_right(self._bound_keys, c) - 1]
            for cc in range(prev, c):
                self._chunk(cc)  # each planned chunk records the next boundary
        start, consumed = self._bounds[c]
        ch = self._plan(c, start, consumed)
        self._add_bound(c + 1, int(ch.ends[-1]), consumed + np.bincount(ch.src, minlength=self._S))
        self._chunks[c] = ch
        if len(self._chunks) > _CHUNK_CACHE:
            self._chunks.popitem(last=False)
        return ch

    def _locate(self, token: int) -> tuple[_Chunk, int]:
        """The chunk and index of the document holding buffer position ``token``."""
        c = self._bound_keys[bisect.bisect_right(self._bound_starts, token) - 1]
        while True:  # every document has at least its separator, so this ends
            ch = self._chunk(c)
            if token < ch.ends[-1]:
                return ch, int(np.searchsorted(ch.ends, token, side="right"))
            c += 1

    def _copy_tokens(self, token: int, out: np.ndarray) -> None:
        """Fill ``out`` with buffer positions ``token .. token+len(out)-1``."""
        ch, i = self._locate(token)
        offset = token - ch.doc_start(i)
        pos, n = 0, out.shape[0]
        while pos < n:
            s, d = int(ch.src[i]), int(ch.doc[i])
            toks = self.manifest.document_tokens(s, d)
            take = min(toks.shape[0] - offset, n - pos)
            if take > 0:
                out[pos : pos + take] = toks[offset : offset + take]
                pos += take
                offset += take
            if pos < n and offset == toks.shape[0]:
                out[pos] = self.eod_id
                pos += 1
            i, offset = i + 1, 0
            if i == PLAN_CHUNK:
                ch, i = self._chunk(ch.index + 1), 0

    # -- public API --------------------------------------------------------------------

    def windows(self, start: int, count: int) -> np.ndarray:
        """Windows ``start .. start+count-1``: int32 ``(count, seq_len + 1)``."""
        start, count = int(start), int(count)
        if start < 0 or count < 0:
            raise ValueError(f"windows needs start >= 0 and count >= 0, got {start}, {count}")
        out = np.empty(count * self.window_tokens, dtype=np.int32)
        if count:
            self._copy_tokens(start * self.window_tokens, out)
        return out.reshape(count, self.window_tokens)

    def document_ids(self, first_doc: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Which documents are stream documents ``first_doc .. first_doc+count-1`` (steps
        1-3): ``(source index, document id within the source)``, two int64 arrays."""
        first_doc, count = int(first_doc), int(count)
        if first_doc < 0 or count < 0:
            raise ValueError(f"document_ids needs first_doc >= 0 and count >= 0, got {first_doc}, {count}")
        src = np.empty(count, dtype=np.int64)
        doc = np.empty(count, dtype=np.int64)
        pos = 0
        while pos < count:
            c, i = divmod(first_doc + pos, PLAN_CHUNK)
            ch = self._chunk(c)
            take = min(PLAN_CHUNK - i, count - pos)
            src[pos : pos + take] = ch.src[i : i + take]
            doc[pos : pos + take] = ch.doc[i : i + take]
            pos += take
        return src, doc

    def windows_at(self, indices) -> np.ndarray:
        """The windows with the given indices, in the given order: int32 ``(n, seq_len + 1)``."""
        idx = [int(m) for m in np.asarray(indices).reshape(-1).tolist()]
        out = np.empty((len(idx), self.window_tokens), dtype=np.int32)
        for row, m in enumerate(idx):
            if m < 0:
                raise ValueError(f"window index must be >= 0, got {m}")
            self._copy_tokens(m * self.window_tokens, out[row])
        return out

    def state_at(self, m: int) -> dict:
        """The JSON resume record for continuing at window ``m`` (module docstring)."""
        m = int(m)
        if m < 0:
            raise ValueError(f"window index must be >= 0, got {m}")
        token = m * self.window_tokens
        ch, i = self._locate(token)
        consumed = ch.consumed + np.bincount(ch.src[:i], minlength=self._S)
        s = int(ch.src[i])
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "manifest_sha256": self.manifest.sha256,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "window": m,
            "token": token,
            "mix_counter": ch.index * PLAN_CHUNK + i,
            "sources": [
                {
                    "name": src.name,
                    "documents_consumed": int(c),
                    "epoch": int(c) // src.training_documents,
                    "position_in_epoch": int(c) % src.training_documents,
                }
                for src, c in zip(self.manifest.sources, consumed.tolist())
            ],
            "partial_document": {
                "source": self.manifest.sources[s].name,
                "document": int(ch.doc[i]),
                "tokens_done": token - ch.doc_start(i),
            },
        }

    @classmethod
    def from_state(cls, manifest: Manifest, seed: int, seq_len: int, state: dict) -> "GlobalStream":
        """A stream positioned by a ``state_at`` record; its windows are the original's.

        The record is checked against the manifest digest, seed and seq_len, and for
        consistency with the mix (its counts must be the ones the mix produces).
        """
        st = cls(manifest, seed, seq_len)
        where = "data stream state"
        expect_keys(
            state,
            ("format", "version", "manifest_sha256", "seed", "seq_len", "window", "token", "mix_counter", "sources", "partial_document"),
            (),
            where,
        )
        if state["format"] != STATE_FORMAT or state["version"] != STATE_VERSION:
            raise DataError(f"{where}: not a {STATE_FORMAT} v{STATE_VERSION} record")
        if state["manifest_sha256"] != manifest.sha256:
            raise DataError(
                f"{where}: made for manifest {state['manifest_sha256']}, not {manifest.sha256} ({manifest.path}); "
                "resume with the data folder the run started with"
            )
        if state["seed"] != st.seed or state["seq_len"] != st.seq_len:
            raise DataError(
                f"{where}: made for seed {state['seed']} / seq_len {state['seq_len']}, "
                f"not {st.seed} / {st.seq_len}; resume with the run's own settings"
            )
        m = expect_int(state["window"], f"{where}.window")
        token = expect_int(state["token"], f"{where}.token")
        g = expect_int(state["mix_counter"], f"{where}.mix_counter")
        if token != m * st.window_tokens:
            raise DataError(f"{where}: token {token} is not window {m} * {st.window_tokens}")
        srcs = state["sources"]
        if not isinstance(srcs, list) or [x.get("name") if isinstance(x, dict) else None for x in srcs] != [
            s.name for s in manifest.sources
        ]:
            raise DataError(f"{where}: sources do not match the manifest's, in order")
        consumed = []
        for x, src in zip(srcs, manifest.sources):
            expect_keys(x, ("name", "documents_consumed", "epoch", "position_in_epoch"), (), f"{where}.sources")
            c = expect_int(x["documents_consumed"], f"{where}.sources[{src.name}].documents_consumed")
            if x["epoch"] != c // src.training_documents or x["position_in_epoch"] != c % src.training_documents:
                raise DataError(f"{where}: source {src.name!r} epoch/position disagree with its documents consumed")
            consumed.append(c)
        consumed_g = np.array(consumed, dtype=np.int64)
        if int(consumed_g.sum()) != g:
            raise DataError(f"{where}: documents consumed sum to {int(consumed_g.sum())}, not mix_counter {g}")
        part = state["partial_document"]
        expect_keys(part, ("source", "document", "tokens_done"), (), f"{where}.partial_document")
        done = expect_int(part["tokens_done"], f"{where}.partial_document.tokens_done")

        # Rebuild the boundary of the chunk holding document g: the mix alone says which
        # sources the chunk's first i documents came from.
        c, i = divmod(g, PLAN_CHUNK)
        before = np.bincount(mix_sources(st._mix, st._cum, c * PLAN_CHUNK, i), minlength=st._S) if i else 0
        consumed_c = consumed_g - before
        if np.any(consumed_c < 0):
            raise DataError(f"{where}: documents consumed per source do not match the mix; the record was altered")
        ch = st._plan(c, 0, consumed_c)
        s = int(ch.src[i])
        length = int(ch.ends[i] - ch.doc_start(i))
        if part["source"] != manifest.sources[s].name or part["document"] != int(ch.doc[i]) or not done < length:
            raise DataError(f"{where}: the partial document does not match the stream; the record was altered")
        token_start = token - done - ch.doc_start(i)
        if token_start < 0:
            raise DataError(f"{where}: the token position is inconsistent with the documents consumed")
        st._add_bound(c, token_start, consumed_c)
        return st


def batch_digest(windows) -> str:
    """Hex SHA-256 of the canonical bytes of an int array of windows::

        SHA-256(BATCH_DIGEST_DOMAIN || b"int32" || ndim (u64 LE) || each dim (u64 LE)
                || values as little-endian int32, row-major)

    The digest depends on the values and shape only, not on the array's int dtype.
    """
    a = np.asarray(windows)
    if a.dtype.kind not in "iu":
        raise TypeError(f"batch_digest takes an integer array, got {a.dtype}")
    if a.size and (int(a.min()) < -(2**31) or int(a.max()) >= 2**31):
        raise ValueError("batch_digest: values must fit in int32")
    h = hashlib.sha256(BATCH_DIGEST_DOMAIN)
    h.update(b"int32")
    h.update(a.ndim.to_bytes(8, "little"))
    for d in a.shape:
        h.update(int(d).to_bytes(8, "little"))
    h.update(np.ascontiguousarray(a, dtype="<i4").tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------------
# The validation windows
# ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidationSplit:
    """The held-out windows of one source (``validation_windows``)."""

    source: str
    documents: int  # validation documents of the source
    tokens: int  # their tokens plus one separator each: the length of the source's buffer
    windows: np.ndarray  # int32 (n, seq_len + 1); n = tokens // (seq_len + 1)

    @property
    def targets(self) -> int:
        """Predicted tokens: ``seq_len`` per window."""
        return int(self.windows.shape[0] * (self.windows.shape[1] - 1))


def validation_windows(manifest: Manifest, seq_len: int) -> list[ValidationSplit]:
    """The held-out windows of every source with validation documents, in manifest order.

    Definition: for source ``s``, its validation documents (ids ``D-V .. D-1``) in id
    order, each followed by the tokenizer's ``eod_id``, are joined into one buffer;
    window ``m`` is ``buffer[m*(L+1) : (m+1)*(L+1)]`` (``L = seq_len``), as the training
    stream cuts its windows; the last ``len(buffer) mod (L+1)`` tokens, too few for a
    window, are not used. Nothing here is random, and the training stream never
    yields these documents (module docstring).
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or int(seq_len) < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    width = int(seq_len) + 1
    out = []
    for si, src in enumerate(manifest.sources):
        if src.validation_documents == 0:
            continue
        pieces = []
        for doc in range(src.training_documents, src.documents):
            pieces.append(manifest.document_tokens(si, doc).astype(np.int32))
            pieces.append(np.array([manifest.eod_id], dtype=np.int32))
        buf = np.concatenate(pieces)
        n = buf.shape[0] // width
        out.append(ValidationSplit(src.name, src.validation_documents, int(buf.shape[0]),
                                   np.ascontiguousarray(buf[: n * width].reshape(n, width))))
    return out

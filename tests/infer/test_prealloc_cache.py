"""The drafter context cache is written in place: ``owner``/``pos`` and the KVLayer keys/values are views of
preallocated buffers, so their storage does not move from round to round once the capacity suffices; and the
drafts are the ones a plain torch.cat cache (the cache before preallocation, :class:`CatCache` below) gives."""

import pytest
import torch
from infer_helpers import hf_greedy, make_drafter

from dspark_lightning.infer import Engine, SamplingParams, make_proposer
from dspark_lightning.infer.verify.kvcache import Buffer, KVLayer, RaggedCache


class CatLayer:
    """A layer that grows by torch.cat, as KVLayer did: a copy of the whole layer every append."""

    def __init__(self) -> None:
        self.keys = self.values = None

    def update(self, k, v) -> None:
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys, self.values = torch.cat([self.keys, k], 2), torch.cat([self.values, v], 2)

    def lookahead(self, k, v, offset):  # a chain step's [context; earlier steps; k], concatenated
        if offset == 0:
            self.ahead = (self.keys, self.values)
        self.ahead = (torch.cat([self.ahead[0], k], 2), torch.cat([self.ahead[1], v], 2))
        return self.ahead


class CatCache(RaggedCache):
    """The bookkeeping before preallocation: plain tensors replaced by a torch.cat / gather copy on every change."""

    owner = pos = None  # plain attributes, not the base class's buffer views

    def __init__(self, n_layers: int, flat: bool) -> None:
        super().__init__([CatLayer() for _ in range(n_layers)], flat=flat)
        rows = 1 if flat else 0
        self.owner, self.pos = torch.full((rows, 0), -1, dtype=torch.long), torch.zeros((rows, 0), dtype=torch.long)

    def _layers(self, fn) -> None:
        for layer in self.layers:
            if layer.keys is not None:
                layer.keys, layer.values = fn(layer.keys), fn(layer.values)

    def add_requests(self, ids) -> None:
        if self.flat:
            return
        n = len(ids)
        self.slots.extend(ids)
        self.owner = torch.cat([self.owner, self.owner.new_full((n, self.length), -1)])
        self.pos = torch.cat([self.pos, self.pos.new_zeros((n, self.length))])
        self._layers(lambda t: torch.cat([t, t.new_zeros((n, *t.shape[1:]))]))

    def remove_requests(self, ids) -> None:
        self.owner = self.owner.masked_fill(torch.isin(self.owner, torch.tensor(ids)), -1)
        if self.flat:
            return
        keep = [i for i, rid in enumerate(self.slots) if rid not in ids]
        self.slots = [self.slots[i] for i in keep]
        self.owner, self.pos = self.owner[keep], self.pos[keep]
        self._layers(lambda t: t[keep])

    def append(self, owner, pos) -> None:
        self.owner, self.pos = torch.cat([self.owner, owner], 1), torch.cat([self.pos, pos], 1)

    def compact(self, slack=2.0, min_free=16, live_max=None) -> bool:
        live = self.owner >= 0
        counts, keep = live.sum(1), min(live_max, self.length)
        if self.length <= slack * keep + min_free:
            return False
        order = torch.argsort((~live).to(torch.int8), dim=1, stable=True)[:, :keep]
        self.owner = torch.gather(self.owner, 1, order).masked_fill(~(torch.arange(keep) < counts[:, None]), -1)
        self.pos = torch.gather(self.pos, 1, order)
        self._layers(lambda t: torch.gather(t, 2, order[:, None, :, None].expand(*t.shape[:2], keep, t.shape[3])))
        return True


def storages(*caches: RaggedCache) -> list[int]:
    """Storage addresses of every cache's bookkeeping and layer tensors."""
    out = []
    for kv in caches:
        out += [kv.owner.untyped_storage().data_ptr(), kv.pos.untyped_storage().data_ptr()]
        for layer in kv.layers:
            if isinstance(layer, KVLayer):
                out += [layer.keys.untyped_storage().data_ptr(), layer.values.untyped_storage().data_ptr()]
    return out


def decode_recorded(target, drafter, batching, reference: bool):
    """Continuous batching (requests join late and finish at different steps): outputs, each draft's logits and
    how many compactions the drafter cache did."""
    prop = make_proposer(drafter, batching=batching)
    if reference:
        prop.kv = CatCache(len(prop.kv.layers), flat=batching == "flat")
    seen, compactions = [], [0]
    propose, compact = prop.propose, prop.kv.compact

    def recording_propose(*a, **kw):
        out = propose(*a, **kw)
        seen.append(out.logits.clone())
        return out

    def counting_compact(*a, **kw):
        done = compact(*a, **kw)
        compactions[0] += done
        return done

    prop.propose, prop.kv.compact = recording_propose, counting_compact
    eng = Engine(target, prop, params=SamplingParams(0.0), stop_token_ids=[], batching=batching, verifier="hf")
    eng.add([[5, 17, 33, 9, 41], [7, 2, 99, 14, 3, 60, 21, 8]], 10)
    eng.add([[11, 12]], 40)
    for _ in range(3):
        eng.step()
    eng.add([[3, 1, 4, 1, 5, 9], [2, 7]], 16)  # join while the others run
    while eng.active:
        eng.step()
    return [r.output for r in sorted(eng.requests, key=lambda r: r.rid)], seen, compactions[0]


CASES = [("dspark", "padded"), ("dspark", "flat"), ("eagle3", "padded"), ("eagle3", "flat")]


@pytest.mark.parametrize(("name", "batching"), CASES)
def test_drafts_equal_a_concatenating_cache_and_decoding_stays_greedy(varied_target, name, batching):
    drafter = make_drafter(varied_target, name=name, block_size=3)
    out, logits, compactions = decode_recorded(varied_target, drafter, batching, reference=False)
    ref_out, ref_logits, ref_compactions = decode_recorded(varied_target, drafter, batching, reference=True)
    prompts = [[5, 17, 33, 9, 41], [7, 2, 99, 14, 3, 60, 21, 8], [11, 12], [3, 1, 4, 1, 5, 9], [2, 7]]
    lengths = [10, 10, 40, 16, 16]
    assert out == ref_out == [hf_greedy(varied_target, p, n) for p, n in zip(prompts, lengths, strict=True)]
    assert compactions == ref_compactions
    assert compactions > 0 or batching == "flat"  # the padded rows drift apart, so removals leave squeezable columns
    assert len(logits) == len(ref_logits) > 10
    for z, z_ref in zip(logits, ref_logits, strict=True):
        torch.testing.assert_close(z, z_ref, rtol=0, atol=0)


@pytest.mark.parametrize(("name", "batching"), [*CASES, ("dspark-state", "padded")])
def test_storage_does_not_move_across_rounds(varied_target, name, batching):
    kw = (
        {"backbone": {"class_path": "dense", "init_args": {"num_layers": 2, "context_state": True}}}
        if name == "dspark-state"
        else {}
    )
    drafter = make_drafter(varied_target, name=name.split("-")[0], block_size=3, **kw)
    prop = make_proposer(drafter, batching=batching)
    eng = Engine(varied_target, prop, params=SamplingParams(0.0), stop_token_ids=[], batching=batching, verifier="hf")
    prompts = [[5, 17, 33, 9, 41], [7, 2, 99, 14, 3, 60, 21, 8], [11, 12]]
    eng.add(prompts, 200)
    eng.step()
    caches = (prop.kv, eng.verifier.kv)  # the target side's bookkeeping too (its HF layers grow by themselves)
    for kv in caches:
        kv.reserve(kv.rows, kv.length + 20 * 4 * (1 if batching == "padded" else len(prompts)))
    before = storages(*caches)
    for _ in range(20):
        eng.step()
        assert storages(*caches) == before
    assert all(len(r.output) < 200 for r in eng.requests)  # a fixed batch all along
    assert prop.kv.length > 20 and eng.verifier.kv.length > 20


def test_without_reserve_the_storage_moves_only_on_doublings(varied_target):
    prop = make_proposer(make_drafter(varied_target, block_size=3))
    eng = Engine(varied_target, prop, params=SamplingParams(0.0), stop_token_ids=[], verifier="hf")
    eng.add([[5, 17, 33, 9, 41], [7, 2, 99]], 200)
    first, seen = prop.kv.length, {tuple(storages(prop.kv))}
    for _ in range(30):
        eng.step()
        seen.add(tuple(storages(prop.kv)))
    # capacity first * 2^k >= length + a block (each round's block keys are written past the context)
    doublings = ((prop.kv.length + prop.block_size) // first).bit_length()
    assert prop.kv.length >= 2 * first
    assert 1 < len(seen) <= 2 * doublings + 1  # owner/pos and keys/values each move only at their own doublings


def test_buffer_appends_in_place_and_doubles():
    b = Buffer(dim=1, fill=-1)
    b.append(torch.arange(6).view(2, 3))
    ptrs = set()
    for i in range(20):
        b.append(torch.full((2, 1), 10 + i))
        ptrs.add(b.data.untyped_storage().data_ptr())
    assert b.used.shape == (2, 23) and b.data.shape == (2, 24)  # 3 -> 6 -> 12 -> 24: three doublings
    assert len(ptrs) == 3
    assert b.used[:, :3].tolist() == [[0, 1, 2], [3, 4, 5]] and b.used[0, 3:].tolist() == list(range(10, 30))
    with pytest.raises(ValueError, match="rows"):
        b.append(torch.zeros((1, 1), dtype=torch.long))


def test_buffer_resize_fills_and_assign_is_in_place_while_it_fits():
    b = Buffer(dim=1, fill=-1)
    b.append(torch.arange(4).view(2, 2))
    b.resize(3, 3)  # one more row and column, both free
    assert b.used.tolist() == [[0, 1, -1], [2, 3, -1], [-1, -1, -1]]
    ptr = b.data.untyped_storage().data_ptr()
    b.assign(torch.tensor([[7], [8]]))  # smaller: written into the same storage
    assert b.used.tolist() == [[7], [8]] and b.data.untyped_storage().data_ptr() == ptr
    b.resize(2, 3)  # the stale tail is refilled, not exposed
    assert b.used.tolist() == [[7, -1, -1], [8, -1, -1]]
    big = torch.zeros((9, 9), dtype=torch.long)
    b.assign(big)  # larger than the capacity: it becomes the buffer
    assert b.data is big


@pytest.mark.parametrize("flat", [False, True])
def test_cache_remove_compact_and_readd_keep_the_storage(flat):
    kv = RaggedCache([KVLayer()], flat=flat)
    kv.add_requests([0, 1])
    rows = kv.rows
    for step in range(6):  # request 0 gets 3 columns a step, request 1 one (padded rows drift apart)
        n = [3, 1]
        grid = kv.grid([0, 1], n)
        own = grid.scatter(torch.where(grid.valid, torch.tensor([[0], [1]]), -1), -1)
        pos = grid.scatter(torch.tensor([[3 * step + j for j in range(3)], [step] * 3]), 0)
        kv.layers[0].update(*(pos[:, None, :, None].expand(rows, 2, -1, 4).float(),) * 2)
        kv.append(own, pos)
    kv.reserve(kv.rows + 1, 2 * kv.length)
    before = storages(kv)
    kv.remove_requests([0])
    assert kv.compact(slack=1.0, min_free=0, live_max=6)
    assert kv.length == 6 and storages(kv) == before
    live = kv.owner >= 0
    assert kv.pos[live].tolist() == list(range(6)) and bool((kv.owner[live] == 1).all())
    assert torch.equal(kv.layers[0].keys[:, 0, :, 0][live], kv.pos[live].float())  # keys moved with their entries
    kv.add_requests([2])
    assert storages(kv) == before
    if not flat:
        assert kv.slots == [1, 2] and kv.owner[1].tolist() == [-1] * 6
        assert torch.equal(kv.layers[0].keys[1], torch.zeros(2, 6, 4))  # a new row: free entries, finite zeros


def test_lookahead_columns_survive_a_doubling_and_are_not_committed():
    b = Buffer(dim=1)
    b.append(torch.tensor([[1, 2]]))  # capacity 2: the look-ahead must grow it
    assert b.lookahead(torch.tensor([[3]]), 0).tolist() == [[1, 2, 3]]
    assert b.lookahead(torch.tensor([[4, 5]]), 1).tolist() == [[1, 2, 3, 4, 5]]  # 2 -> 4 -> 8, 3 kept across
    assert b.used.tolist() == [[1, 2]]  # nothing committed
    b.append(torch.tensor([[9]]))
    assert b.used.tolist() == [[1, 2, 9]] and b.ahead == 0
    with pytest.raises(ValueError, match="look-ahead"):
        b.lookahead(torch.tensor([[0]]), 1)  # a gap after the committed columns

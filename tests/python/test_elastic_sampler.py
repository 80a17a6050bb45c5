"""tt.ElasticSampler without a job (docs/elastic.md#pytorch): the shards of each world, and what
is left of an epoch re-sharded at a resize, as every worker computes it on its own."""
import collections
import itertools

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (python3-torch) is not importable")

import trellis.torch as tt  # noqa: E402


def samplers(n, size, seed=3):
    """One sampler per rank of a world of `size`, as each worker would hold it."""
    out = []
    for r in range(size):
        s = tt.ElasticSampler(range(n), shuffle=True, seed=seed)
        s.reshard(r, size)  # nothing drawn yet: only the world is set
        out.append(s)
    return out


def test_shards_are_distributed_samplers_and_cover_the_epoch():
    world = samplers(100, 3)
    shards = [list(s) for s in world]
    assert {len(x) for x in shards} == {34}  # padded to 102, as DistributedSampler pads
    seen = collections.Counter(itertools.chain(*shards))
    assert set(seen) == set(range(100)) and sum(seen.values()) == 102
    # The same seed and epoch: every worker computes the same order.
    assert shards == [list(s) for s in samplers(100, 3)]


@pytest.mark.parametrize("n,old,new,steps,batch", [(960, 3, 2, 29, 8), (1000, 4, 3, 7, 5), (97, 3, 1, 4, 4)])
def test_a_resize_mid_epoch_trains_the_rest_once(n, old, new, steps, batch):
    world = samplers(n, old)
    its = [iter(s) for s in world]
    trained = []
    for _ in range(steps * batch):  # every rank draws as many (lockstep)
        for it in its:
            trained.append(next(it))
    for r, s in enumerate(world[:new]):  # the lowest ranks stay, ranks renumbered densely
        s.reshard(r, new)
    rest = [list(it) for it in its[:new]]  # the same iterators go on
    assert len({len(x) for x in rest}) == 1, "every worker of the new world as many samples"
    seen = collections.Counter(trained + list(itertools.chain(*rest)))
    assert set(seen) == set(range(n))
    assert sum(seen.values()) - n < new, "only the padding of the last shards repeats"


def test_set_epoch_starts_a_new_order_and_a_second_pass_repeats_the_epoch():
    s = samplers(50, 2)[1]
    first = list(s)
    assert list(s) == first  # no set_epoch: the same epoch again
    s.set_epoch(1)
    assert list(s) != first and len(list(s)) == 25

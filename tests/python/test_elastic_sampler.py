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


def draw(its, count):
    """Every rank draws `count` samples (lockstep); returns them."""
    out = []
    for _ in range(count):
        for it in its:
            out.append(next(it))
    return out


def test_a_restored_place_goes_on_where_the_world_is():
    # A restarted worker (rank 1 of 3) takes rank 0's place after a resize 4 -> 3 and 20 more
    # draws: it draws exactly what its own iterator would have, and set_epoch of that epoch
    # (the training loop's first line) keeps the place.
    world = samplers(500, 4)
    for s in world:
        s.set_epoch(2)
    its = [iter(s) for s in world]
    draw(its, 30)
    for r, s in enumerate(world[:3]):
        s.reshard(r, 3)
    draw(its[:3], 20)
    place = world[0].place()
    assert len(repr(place)) < 200, "a place is small, whatever the dataset"
    restarted = tt.ElasticSampler(range(500), shuffle=True, seed=3)
    restarted.restore_place(place, 1)
    restarted.set_epoch(2)
    assert list(restarted) == list(its[1])


def test_a_place_from_before_a_grow_is_resharded_as_the_members_reshard():
    # A grow 2 -> 3: the joiner takes a member's place committed before the switch (the old
    # world's), re-shards it as the members do, and the three draw the rest of the epoch once.
    n = 301
    world = samplers(n, 2)
    its = [iter(s) for s in world]
    trained = draw(its, 40)
    place = world[1].place()
    for r, s in enumerate(world):
        s.reshard(r, 3)
    joiner = tt.ElasticSampler(range(n), shuffle=True, seed=3)
    joiner.restore_place(place, 0)
    joiner.reshard(2, 3)
    joiner.set_epoch(0)
    rest = [list(it) for it in its] + [list(joiner)]
    assert len({len(x) for x in rest}) == 1, "every worker of the new world as many samples"
    seen = collections.Counter(trained + list(itertools.chain(*rest)))
    assert set(seen) == set(range(n))
    assert sum(seen.values()) - n < 3, "only the padding of the last shards repeats"
    # The next epoch starts afresh, as on the members.
    joiner.set_epoch(1)
    world[0].set_epoch(1)
    assert len(list(joiner)) == len(list(world[0]))


def test_a_place_of_another_dataset_is_refused():
    place = samplers(100, 2)[0].place()
    other = tt.ElasticSampler(range(99), shuffle=True, seed=3)
    with pytest.raises(RuntimeError, match="has 100 samples, this one 99"):
        other.restore_place(place, 0)

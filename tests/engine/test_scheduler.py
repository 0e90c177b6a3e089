"""Scheduler on a fake KV configuration: batching, chunked prefill, preemption, refusal."""

from wedlm.engine.block_manager import BlockManager
from wedlm.engine.request import SeqStatus, Sequence
from wedlm.engine.sampling_params import SamplingParams
from wedlm.engine.scheduler import Scheduler


def seq(n, rid, window=4):
    s = Sequence(rid, list(range(1, n + 1)), n, SamplingParams(), max_len=64, window_size=window)
    s.window = [None] * window
    return s


def run_step(sched, out):
    """Pretend the forward ran: fed context becomes cached; windows commit nothing."""
    for item in out.scheduled:
        item.seq.num_cached += item.num_context


def test_prefill_and_decode_share_a_step():
    sched = Scheduler(BlockManager(32, 4), max_num_seqs=4, max_num_batched_tokens=64)
    a = seq(5, "a")
    sched.add(a)
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_context, i.with_window, i.query_len) for i in out.scheduled] == [
        ("a", 5, True, 9)]
    run_step(sched, out)
    b = seq(3, "b")
    sched.add(b)
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_context, i.query_len) for i in out.scheduled] == [("a", 0, 4), ("b", 3, 7)]
    assert len(b.block_table) == 2 and len(a.block_table) == 3


def test_long_prompt_is_chunked_and_keeps_last_token_for_the_window():
    sched = Scheduler(BlockManager(32, 4), max_num_seqs=4, max_num_batched_tokens=10)
    a = seq(20, "a")
    sched.add(a)
    fed = []
    for _ in range(4):
        out = sched.schedule()
        fed.append([(i.num_context, i.with_window) for i in out.scheduled])
        run_step(sched, out)
    assert fed == [[(10, False)], [(9, False)], [(1, True)], [(0, True)]]


def test_preemption_frees_and_resumes():
    bm = BlockManager(6, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = seq(8, "a"), seq(8, "b")
    sched.add(a)
    sched.add(b)
    out = sched.schedule()  # a: 8 + 4 rows = 3 blocks; b: 3 blocks
    assert len(out.scheduled) == 2 and bm.num_free == 0
    run_step(sched, out)
    a.tokens += [7, 7, 7, 7]  # a commits its window: it needs a 4th block
    a.num_cached += 4
    out = sched.schedule()
    assert out.preempted == [b] and b.status is SeqStatus.WAITING and b.block_table == []
    assert b.window == [None] * 4 and b.stats.preemptions == 1
    assert [i.seq.request_id for i in out.scheduled] == ["a"]
    sched.finish(a)
    out = sched.schedule()
    assert [i.seq.request_id for i in out.scheduled] == ["b"]
    sched.finish(b)
    assert bm.num_free == 6


def test_request_that_cannot_fit_alone_is_refused_not_hung():
    bm = BlockManager(2, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    big = seq(10, "big")
    sched.add(big)
    out = sched.schedule()
    assert out.refused == [big] and out.scheduled == [] and bm.num_free == 2
    assert not sched.has_unfinished()


def test_queued_prefix_hits_never_make_a_fitting_request_refused():
    """Blocks a queued request took at admission are released before the head is refused."""
    bm = BlockManager(4, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    shared = list(range(1, 9))
    owner = Sequence("owner", shared + [9], 9, SamplingParams(), max_len=64, window_size=4)
    bm.grow(owner, 9)
    owner.num_cached = 9
    bm.register_full_blocks(owner)
    bm.free(owner)  # its two full blocks stay in the prefix cache
    queued = Sequence("queued", shared + [10], 9, SamplingParams(), max_len=64, window_size=4)
    queued.window = [None] * 4
    assert bm.admit(queued) == 8 and bm.num_free == 2  # holds the two hit blocks while it waits
    head = seq(12, "head")  # 12 + 4 rows = all 4 blocks: fits alone
    head.tokens = [100 + t for t in head.tokens]  # no prefix shared with `queued`
    sched.waiting.extend([head, queued])
    out = sched.schedule()
    assert [i.seq.request_id for i in out.scheduled] == ["head"] and out.refused == []
    assert queued.block_table == [] and queued.status is SeqStatus.WAITING
    sched.finish(head)
    out = sched.schedule()
    assert [(i.seq.request_id, i.num_context) for i in out.scheduled] == [("queued", 9)]  # head evicted the hits
    sched.finish(queued)
    assert bm.num_free == 4


def test_max_num_seqs_limits_admission():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=64)
    for r in "abc":
        sched.add(seq(3, r))
    out = sched.schedule()
    assert [i.seq.request_id for i in out.scheduled] == ["a", "b"] and len(sched.waiting) == 1

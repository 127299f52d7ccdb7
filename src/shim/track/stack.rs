//! The allocating thread's stack as an interned call site: captured (native frames,
//! then Python ones, then the phase label), found again through the thread's memos
//! and site cache, or passed over by the sampler (`GPUGUARD_STACK_RATE`) with the
//! weight a capture stands for.

use super::*;

pub(super) const MAX_FRAMES: usize = gpuguard_core::config::MAX_STACK_DEPTH;
/// Python frames kept after the native ones, in a thread running Python.
pub(super) const PY_FRAMES: usize = 16;
/// Native frames kept (at most) in a thread running Python.
const PY_THREAD_NATIVE: usize = 8;

/// This thread's stack bounds, asked once per thread.
pub(super) fn stack_bounds(t: &ThreadState) -> (usize, usize) {
    let b = &t.stack;
    let mut v = b.get();
    if v == (0, 0) {
        v = unwind::stack_bounds();
        b.set(if v == (0, 0) { (1, 1) } else { v });
    }
    v
}

/// The caller's stack as an interned site id; gpuguard's own frames are skipped.
/// With stacks off (`GPUGUARD_STACK_DEPTH=0`) the hook does only this one test.
#[inline]
pub(super) fn capture_site_in(books: &Books, t: &ThreadState) -> u32 {
    let depth = stacks().depth;
    if depth == 0 {
        return NO_SITE;
    }
    capture_site_at(books, t, depth)
}

/// The stack of an allocation of `bytes` made at `t_ns` in a hook and the weight of
/// its capture, or none where the sampler passed it over (`GPUGUARD_STACK_RATE`;
/// `gpuguard_core::sampler`). Only the hooks' own allocations are sampled: a cap's
/// refusal, a runtime call the driver hook did not see, always get theirs.
#[inline]
pub(super) fn sampled_site(books: &Books, t: &ThreadState, t_ns: u64, bytes: u64) -> (u32, Weight) {
    let c = stacks();
    if c.depth == 0 {
        return (NO_SITE, sampler::ONE);
    }
    let Some(rate) = c.rate else {
        return (capture_site_at(books, t, c.depth), sampler::ONE);
    };
    let mut s = t.sampler.get();
    if s.is_fresh() {
        s = Sampler::seeded(thread_id(t));
    }
    let resumed = bench_switch::resumptions();
    if t.sampler_resumed.get() != resumed {
        // The benchmark's books were paused since this thread's last allocation:
        // a pause is not a quiet spell (see `bench_switch::resumptions`).
        t.sampler_resumed.set(resumed);
        s.restart(t_ns);
    }
    let weight = s.take(t_ns, bytes, Some(rate));
    t.sampler.set(s);
    if weight != sampler::NONE {
        return (capture_site_at(books, t, c.depth), weight);
    }
    if unwind::counting() {
        unwind::SAMPLED_OUT.fetch_add(1, Relaxed);
    }
    // No site, not even a phase label's: the captured allocations' weights stand
    // for this one, under its label too (a capture's stack ends in the label).
    (NO_SITE, sampler::NONE)
}

/// The site id of the stack `pcs` in `books`, whose sites the thread's cache holds:
/// the cache (by fingerprint) names most stacks without the shared site table.
/// Whether the site is new to the table, too.
pub(super) fn cached_site(books: &Books, t: &ThreadState, pcs: &[usize]) -> (u32, bool) {
    let fp = fingerprint(pcs);
    match t.site_cache.get(fp) {
        Some(id) => (id, false),
        None => {
            let (id, new) = books.sites.intern_new(pcs);
            t.site_cache.put(fp, id);
            (id, new)
        }
    }
}

/// `capture_site_in` with stacks on, out of line (it saves many registers).
#[inline(never)]
pub(super) fn capture_site_at(books: &Books, t: &ThreadState, depth: usize) -> u32 {
    let here = books as *const Books as usize;
    // SAFETY: the box lives until the thread's `MemoRelease` frees it, and this is
    // the one reference to it: a hook never runs inside another on the same thread
    // (a signal handler's hook takes the stash path, which reads no memo).
    let mut memos = if timing::memos_off() {
        None
    } else {
        memos(t).map(|p| unsafe { &mut *p.as_ptr() })
    };
    if t.site_cache_books.get() != here {
        t.site_cache.clear();
        if let Some(m) = &mut memos {
            m.clear();
        }
        t.site_cache_books.set(here);
    }
    // Where this function's frame is: a memo's stack addresses are measured from it.
    let anchor_slot = 0u8;
    let anchor = std::hint::black_box(&anchor_slot) as *const u8 as usize;
    let py = frames::thread_state();
    let tag = t.tag.get();
    // Where the capture is made: how deep the stack is here (the native path that
    // reached it, mostly) and the innermost Python frame with its instruction.
    let key = memo::key(anchor, frames::innermost(py));
    if let Some(m) = &mut memos {
        if let Some(id) = m.find(key, anchor, py, tag) {
            timing::lap(Phase::RecMemo);
            if unwind::counting() {
                unwind::REMEMBERED.fetch_add(1, Relaxed);
            }
            return id;
        }
        if unwind::counting() && m.has(key) {
            unwind::MEMO_STALE.fetch_add(1, Relaxed);
        }
    }
    // SAFETY: this thread's own buffers; a hook never runs inside another on the
    // same thread (the driver guard), so nothing else holds them now.
    let pcs = unsafe { &mut *t.scratch.get() };
    // In a thread running Python, its Python frames say where, and native frames past
    // the framework's first few are the interpreter's: those are cut, never the
    // Python ones. The Python frames are read first (into the tail), so a thread that
    // has a thread state but runs no Python now (a framework's worker, such as
    // PyTorch's autograd threads) keeps its whole native stack.
    // They are read to where they go when the native frames fill their share (most
    // often), and moved down only when there are fewer.
    let cut = depth.min(PY_THREAD_NATIVE);
    let py_n = if py != 0 {
        let visits = memos.as_deref_mut().map(|m| &mut m.visits);
        frames::walk(py, &mut pcs[cut..cut + PY_FRAMES], visits)
    } else {
        0
    };
    timing::lap(Phase::RecPython);
    let native = if py_n > 0 { cut } else { depth };
    let mut n = unwind::capture(
        &mut pcs[..native.min(MAX_FRAMES)],
        stack_bounds(t),
        own_code(),
        memos.as_deref_mut().map(|m| &mut m.reads),
    );
    timing::lap(Phase::RecNative);
    if py_n > 0 {
        if n < cut {
            pcs.copy_within(cut..cut + py_n, n);
        }
        n += py_n;
    }
    // The thread's phase label (`gpuguard_push_tag`), as the outermost frame.
    if tag != 0 {
        pcs[n] = tags::entry(tag);
        n += 1;
    }
    let id = if n == 0 {
        NO_SITE
    } else {
        let (id, new) = cached_site(books, t, &pcs[..n]);
        if new && py_n > 0 {
            // Its Python code is running now: the time to copy what names it.
            names::remember(&pcs[..n]);
        }
        id
    };
    if let Some(m) = memos
        && !m.put(key, anchor, py, tag, id)
        && unwind::counting()
    {
        unwind::MEMO_UNKEPT.fetch_add(1, Relaxed);
    }
    id
}

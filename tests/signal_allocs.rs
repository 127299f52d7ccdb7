//! Allocations made by a signal handler that interrupted a hook on the same thread
//! (issue 11): the main thread loops allocate/free through the linked driver while a
//! second thread sends it SIGALRM; the handler allocates (and frees some of its own)
//! from inside the interrupted hooks. The exit report's live list must be exactly
//! what the handler kept.

mod common;
mod core_support;

use core_support::*;

#[test]
fn allocations_from_a_signal_handler_inside_a_hook_are_recorded() {
    let r = gg_run(
        "gg",
        &["sigalloc", "300"],
        &[("SIMCUDA_FREE_DELAY_MS", "1"), ("SIMCUDA_SIGSAFE", "1")],
    );
    r.assert_ok();
    let out = r.out();
    let s = &out.kv("SIGALLOC")[0];
    assert_eq!(s["kept"], 300, "{}", r.describe());
    assert_eq!(s["fails"], 0, "{}", r.describe());
    // the handler really ran inside hooks: far more runs than kept (a free every
    // fourth run) and a main loop that was interrupted many times
    assert!(s["runs"] >= 300, "{s:?}");
    let (_, rep) = exit_report(&r);
    let want = leak_set(out);
    assert_eq!(want.len(), 300);
    let got = live_set(&rep);
    let missing = want.difference(&got).count();
    let extra = got.difference(&want).count();
    assert_eq!(
        (missing, extra),
        (0, 0),
        "exit report live[] vs the handler's books: {missing} of {} missing, {extra} extra",
        want.len()
    );
    // their call site is the handler (a few may have none: a handler that struck
    // while the hook was in gpuguard's own code is not walked)
    let in_handler = live(&rep)
        .into_iter()
        .filter(|e| {
            let Some(id) = e["site"].as_u64() else {
                return false;
            };
            rep["sites"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|s| s["id"].as_u64() == Some(id))
                .filter_map(|s| s["frames"].as_array()?.first()?.as_str())
                .any(|f| f.contains("sig_alloc_handler"))
        })
        .count();
    assert!(in_handler > 0, "no live record names the handler");
    // gpuguard's counters agree with the driver's books
    let gg = out.gg(0).expect("GG line");
    let sim = out.sim(0).expect("SIM line");
    assert_eq!(gg["current"], sim["live"], "{}", r.describe());
}

/// The other kind of nested hook: the driver calling its own export from inside a
/// hooked call (`SIMCUDA_REENTER`: the sim's `cuMemAllocManaged` allocates through
/// its exported `cuMemAlloc_v2`). It still passes straight through: one record,
/// named for the call the program made, counted once.
#[test]
fn the_driver_calling_its_own_export_is_not_taken_for_a_signal_handler() {
    let plain = gg_run("gg", &["link"], &[]);
    let r = gg_run("gg", &["link"], &[("SIMCUDA_REENTER", "1")]);
    plain.assert_ok();
    r.assert_ok();
    let (_, rep) = exit_report(&r);
    assert_eq!(live_set(&rep), leak_set(r.out()), "{}", r.describe());
    let managed = r
        .allocs()
        .into_iter()
        .find(|a| a.kind == "managed")
        .expect("a managed ALLOC line");
    let e = live_entry(&rep, managed.addr).expect("the managed allocation is live");
    assert_eq!(e["api"], "cuMemAllocManaged", "{e}");
    assert_eq!(e["kind"], "managed", "{e}");
    let (gg, gg_plain) = (r.gg(0).unwrap(), plain.gg(0).unwrap());
    assert_eq!(gg["allocs"], gg_plain["allocs"], "counted once");
    assert_eq!(gg["current"], r.sim(0).unwrap()["live"]);
}

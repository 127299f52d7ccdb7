//! Property tests for every settings parser: arbitrary text never makes one panic, and
//! valid values read back to what they mean (a cap printed by its formatter parses to
//! the same spec, `N%` and `0.N` agree, each signal form lands on its number, a
//! directory's bytes are kept). Case counts are bounded so the file runs in a few
//! seconds in a debug build.

use gpuguard_core::cap::{self, CapSpec, Limit};
use gpuguard_core::config::{
    self, Config, KNOWN_VARS, LogLevel, MAX_STACK_DEPTH, parse_count, parse_interval_ms, parse_log,
    parse_signal, parse_threshold,
};
use gpuguard_core::report::human_bytes;
use proptest::prelude::*;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

/// `n` cases from a fixed seed, so a run of the suite is the same run every time
/// (a test that passes once passes always); `PROPTEST_RNG_SEED=N` explores others.
fn cases(n: u32) -> ProptestConfig {
    let mut config = ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x6770_7567_7561_7264);
    }
    config
}

/// Text a person might type into a setting, and its near misses.
fn setting_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ 0-9.+%:,_-]{0,12}[a-zA-Z%]{0,5}[ 0-9.+-]{0,6}",
        "(SIG)?(RTMIN|RTMAX|rtmin|rtmax|USR1|KILL|HUP)?[ +-]{0,2}[0-9]{0,12}",
        "[0-9]{0,25}(\\.[0-9]{0,25})?(e[+-]?[0-9]{1,4})?(ms|s|m|h|%|GiB|kb|T)?",
    ]
}

fn signal_allowed(n: i32) -> bool {
    let forbidden = [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGABRT,
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGSYS,
    ];
    ((1..32).contains(&n) && !forbidden.contains(&n))
        || (libc::SIGRTMIN()..=libc::SIGRTMAX()).contains(&n)
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        (1u64..=u64::MAX).prop_map(Limit::Bytes),
        (1u64..1 << 20, 0u32..=40).prop_map(|(n, s)| Limit::Bytes(n << s)),
        (1u64..=1 << 53).prop_map(|n| Limit::Fraction(n as f64 / (1u64 << 53) as f64)),
        (1u32..=100).prop_map(|p| Limit::Fraction(f64::from(p) / 100.0)),
    ]
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn no_parser_panics(s in setting_text()) {
        let _ = CapSpec::parse(&s);
        let _ = cap::parse_limit(&s);
        let _ = cap::parse_size(&s);
        let _ = parse_threshold(&s);
        let _ = parse_interval_ms(&s);
        let _ = parse_log(&s);
        let _ = parse_count(&s);
        if let Some(Some(n)) = parse_signal(&s) {
            prop_assert!(signal_allowed(n), "{s:?} gave {n}");
        }
    }

    /// Any variable with any bytes: parsing ends in a configuration or in an error
    /// naming that variable, never a panic.
    #[test]
    fn whole_configuration_never_panics(
        var in prop_oneof![proptest::sample::select(KNOWN_VARS), Just("GPUGUARD_X")],
        value in proptest::collection::vec(any::<u8>(), 0..24),
        text in setting_text(),
    ) {
        for v in [OsString::from_vec(value.clone()), OsString::from(text.clone())] {
            match Config::parse_os([(OsString::from(var), v)]) {
                Ok(p) => prop_assert_eq!(p.warnings.len(), usize::from(var == "GPUGUARD_X")),
                Err(e) => prop_assert_eq!(e.var.as_str(), var),
            }
        }
    }

    /// A cap spec printed by its formatter parses back to the same spec.
    #[test]
    fn caps_round_trip(
        default in proptest::option::of(limit()),
        devices in proptest::collection::btree_map(0u32..16, limit(), 0..4),
    ) {
        let spec = CapSpec { default, per_device: devices, per_uuid: Default::default() };
        prop_assume!(!spec.is_empty());
        let text = spec.to_string();
        prop_assert_eq!(CapSpec::parse(&text), Some(spec), "{}", text);
    }

    /// Sizes: every unit spelling means its multiple, exactly; and a size as `gpuguard`
    /// prints it for people (one decimal) reads back within that decimal.
    #[test]
    fn sizes_mean_what_they_say(
        n in 1u64..1 << 20,
        unit in proptest::sample::select(&[
            ("", 1u64), ("b", 1), ("k", 1 << 10), ("KiB", 1 << 10), ("m", 1 << 20),
            ("MiB", 1 << 20), ("G", 1 << 30), ("gib", 1 << 30), ("TiB", 1 << 40),
            ("kB", 1_000), ("MB", 1_000_000), ("GB", 1_000_000_000), ("tb", 1_000_000_000_000),
        ][..]),
        blank in proptest::bool::ANY,
        b in 1u64..1 << 60,
    ) {
        let (name, mult) = unit;
        let text = format!("{n}{}{name}", if blank { " " } else { "" });
        prop_assert_eq!(cap::parse_size(&text), Some(n * mult), "{}", text);
        prop_assert_eq!(cap::parse_size(&cap::exact_size(n * mult)), Some(n * mult));

        let shown = human_bytes(b);
        let back = cap::parse_size(&shown).unwrap();
        let unit = 1u64 << (10 * (63 - b.leading_zeros()).div_euclid(10));
        prop_assert!(back.abs_diff(b) <= unit / 20 + 1, "{} -> {} for {}", shown, back, b);
    }

    /// `N%` and `0.N` agree, and a fraction written out reads back exactly.
    #[test]
    fn thresholds_agree(p in 1u32..=100, k in 1u64..=1 << 53) {
        let pct = parse_threshold(&format!("{p}%")).unwrap().unwrap();
        let dec = parse_threshold(&format!("{}", f64::from(p) / 100.0)).unwrap().unwrap();
        prop_assert!((pct - dec).abs() < 1e-12, "{} vs {}", pct, dec);
        let f = k as f64 / (1u64 << 53) as f64;
        prop_assert_eq!(parse_threshold(&format!("{f}")), Some(Some(f)));
        prop_assert_eq!(parse_threshold(&format!(" {}% ", f * 100.0)).map(|x| x.map(|x| (x - f).abs() < 1e-12)), Some(Some(true)));
    }

    /// Intervals: each unit means its multiple.
    #[test]
    fn intervals_mean_what_they_say(n in 1u64..1_000_000) {
        prop_assert_eq!(parse_interval_ms(&format!("{n}ms")), Some(Some(n)));
        prop_assert_eq!(parse_interval_ms(&format!("{n}s")), Some(Some(n * 1_000)));
        prop_assert_eq!(parse_interval_ms(&format!("{n} m")), Some(Some(n * 60_000)));
        prop_assert_eq!(parse_interval_ms(&format!("{n}H")), Some(Some(n * 3_600_000)));
        prop_assert_eq!(parse_interval_ms(&format!("{}.5s", n)), Some(Some(n * 1_000 + 500)));
    }

    /// Counts: stack depth within 0..=64, live allocations from 1, blanks allowed.
    #[test]
    fn counts(n in any::<usize>(), pad in "[ \t]{0,2}") {
        let text = format!("{pad}{n}{pad}");
        prop_assert_eq!(parse_count(&text), Some(n));
        let depth = Config::parse_os([("GPUGUARD_STACK_DEPTH", text.as_str())]);
        match depth {
            Ok(p) => prop_assert!(n <= MAX_STACK_DEPTH && p.config.stack_depth == n),
            Err(_) => prop_assert!(n > MAX_STACK_DEPTH),
        }
        let max_live = Config::parse_os([("GPUGUARD_MAX_LIVE", text.as_str())]);
        match max_live {
            Ok(p) => prop_assert!(n >= 1 && p.config.max_live == Some(n)),
            Err(_) => prop_assert_eq!(n, 0),
        }
    }

    /// A report directory is kept byte for byte.
    #[test]
    fn dirs_are_bytes(dir in proptest::collection::vec(1u8..=255, 1..64)) {
        let p = Config::parse_os([(OsString::from("GPUGUARD_DIR"), OsString::from_vec(dir.clone()))]).unwrap();
        prop_assert_eq!(p.config.dir.unwrap().into_os_string().into_vec(), dir);
    }
}

/// Every signal number, name and real-time form, all at once: the accepted ones land
/// on their number whatever the case or `SIG` prefix; the rest are refused.
#[test]
fn every_signal_form() {
    let (rtmin, rtmax) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    for n in -5..=200 {
        let got = parse_signal(&n.to_string());
        assert_eq!(got, signal_allowed(n).then_some(Some(n)), "{n}");
    }
    for k in 0..=80 {
        let up = rtmin + k;
        let down = rtmax - k;
        for (form, want) in [
            (format!("RTMIN+{k}"), (up <= rtmax).then_some(up)),
            (format!("sigrtmin+{k}"), (up <= rtmax).then_some(up)),
            (format!(" SIGRTMAX-{k} "), (down >= rtmin).then_some(down)),
            (format!("rtmax-{k}"), (down >= rtmin).then_some(down)),
            (format!("RTMIN-{k}"), None),
            (format!("RTMAX+{k}"), None),
            (format!("RTMIN+-{k}"), None),
            (format!("RTMIN+0{k}"), None),
        ] {
            assert_eq!(parse_signal(&form), want.map(Some), "{form}");
        }
    }
    for (name, n) in [
        ("HUP", libc::SIGHUP),
        ("USR1", libc::SIGUSR1),
        ("usr2", libc::SIGUSR2),
        ("Term", libc::SIGTERM),
        ("WINCH", libc::SIGWINCH),
    ] {
        for form in [name.to_string(), format!("SIG{name}"), format!("sig{name}")] {
            assert_eq!(parse_signal(&form), Some(Some(n)), "{form}");
        }
    }
    for off in ["none", "NONE", " None "] {
        assert_eq!(parse_signal(off), Some(None));
    }
    // Spellings the documentation never listed.
    for undocumented in ["off", "OFF", "0", "no"] {
        assert_eq!(parse_signal(undocumented), None, "{undocumented}");
    }
}

/// Every log level, any case, blanks around; nothing but the documented four.
#[test]
fn every_log_level() {
    for undocumented in ["none", "0", "warning", "1", "error"] {
        assert_eq!(parse_log(undocumented), None, "{undocumented}");
    }
    for (text, level) in [
        ("off", LogLevel::Off),
        ("warn", LogLevel::Warn),
        ("info", LogLevel::Info),
        ("debug", LogLevel::Debug),
    ] {
        for form in [text.to_string(), text.to_uppercase(), format!(" {text}\t")] {
            assert_eq!(parse_log(&form), Some(level), "{form}");
        }
    }
    assert_eq!(config::parse_log("loud"), None);
}

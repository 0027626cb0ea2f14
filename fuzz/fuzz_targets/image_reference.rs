//! Image references and platforms, as users and jobs write them. The agent reads
//! references by hand (rigger_pull's reference.rs); every ASCII input must read as
//! `oci-spec`'s regular expression reads it: refused by both, or the same name.
#![no_main]

use std::str::FromStr;

use libfuzzer_sys::fuzz_target;
use rigger_pull::media::Platform;

fuzz_target!(|text: &str| {
    let ours = rigger_pull::normalized_name(text).ok();
    if text.is_ascii() {
        let theirs = oci_spec::distribution::Reference::from_str(text)
            .ok()
            // Pulls also refuse uppercase repositories, which the expression allows.
            .filter(|r| !r.repository().chars().any(|c| c.is_ascii_uppercase()))
            .map(|r| r.whole());
        assert_eq!(ours, theirs, "{text:?}");
    }
    let _ = Platform::parse(text);
});

//! Image references and platforms, as users and jobs write them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rigger_pull::media::Platform;

fuzz_target!(|text: &str| {
    let _ = rigger_pull::check_reference(text);
    let _ = Platform::parse(text);
});

//! Fidelity kept while going faster: random layer stacks (`scripts/lab-images random`:
//! files, directories, symlinks inside and out of the root, hard links, whiteouts, opaque
//! directories, entries below what a lower layer made a symlink or a file, duplicates,
//! children before their directory, owners, modes, mtimes; gzip, zstd or none) pulled by
//! `rigger-agent` and by `ctr images pull` on the same containerd, and compared: the same
//! image record, the same labels on every blob, the same rootfs file for file.
//!
//! The seeds are fixed so a failure is reproducible (`scripts/lab image random --name N
//! --seed S` rebuilds the stack); `RIGGER_FIDELITY_SEEDS=FROM..TO` explores others, on
//! every containerd. By default every stack is compared on two containerd versions, each
//! version taking two fifths of the seeds: the unpacker is Rigger's own whatever the
//! version, and the stacks are CPU work that `make test` shares with everything else
//! (all 24 on all five took 100-300 s each beside a full run on 2 cores).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code

use std::ops::Range;

use rigger_integration_tests::fidelity::compare_outcome_with_ctr;
use rigger_integration_tests::{Containerd, LabNode, lab_image, on_every_containerd};

/// Seeds run by `make test`: a few seconds each per containerd.
const SEEDS: Range<u64> = 0..24;

/// The seeds compared on `containerd`.
fn seeds(containerd: Containerd) -> Vec<u64> {
    if let Ok(range) = std::env::var("RIGGER_FIDELITY_SEEDS") {
        let (from, to) = range
            .split_once("..")
            .expect("RIGGER_FIDELITY_SEEDS is FROM..TO");
        return (from.parse().unwrap()..to.parse().unwrap()).collect();
    }
    let versions = Containerd::ALL.len() as u64;
    let index = Containerd::ALL
        .iter()
        .position(|c| *c == containerd)
        .expect("a lab version") as u64;
    // Seed s on the versions s % 5 and the one after it (2.4's after is 1.6).
    SEEDS
        .filter(|seed| [index, (index + versions - 1) % versions].contains(&(seed % versions)))
        .collect()
}

fn random_stacks_unpack_as_containerd_does(node: &LabNode) {
    let series = node.containerd.series().replace('.', "");
    let (mut pulled, mut refused) = (Vec::new(), Vec::new());
    for seed in seeds(node.containerd) {
        let repo = format!("rigger-lab/random-stack-{seed}");
        // The same seed is the same image: tests on other containerds may push it too.
        lab_image(&["random", "--name", &repo, "--seed", &seed.to_string()]);
        eprintln!("containerd {}: seed {seed}", node.containerd.series());
        let test = format!("random-{series}-{seed}");
        if compare_outcome_with_ctr(node, &format!("{repo}:1"), &test) {
            pulled.push(seed);
        } else {
            refused.push(seed);
        }
    }
    eprintln!("pulled by both: {pulled:?}; refused by both: {refused:?}");
    // Stacks are drawn to be ones containerd takes: mostly compared tree for tree.
    assert!(
        pulled.len() >= 3 * refused.len(),
        "too few stacks pulled to compare: {pulled:?}, refused {refused:?}"
    );
}

on_every_containerd!(random_stacks_unpack_as_containerd_does);

//! What the benchmark binaries (`src/bin/`) share: a real controller and agent on the lab
//! node ([`cluster`]), a real controller under simulated agents ([`simulated`]), the
//! controller as deployed in the lab's cluster ([`in_cluster`]), where the machine's CPU
//! goes ([`machine`]), Prometheus histograms ([`histogram`]), and the sections of
//! BENCHMARKS.md each benchmark writes ([`report`]).

pub mod cluster;
pub mod histogram;
pub mod in_cluster;
pub mod machine;
pub mod report;
pub mod simulated;

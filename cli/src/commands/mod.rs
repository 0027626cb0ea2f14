//! One file per verb, as kubectl's and youki's commands are kept: each has its clap
//! arguments (`Args`) and a `run`.

pub mod apply;
pub mod delete;
pub mod describe;
pub mod exec;
pub mod explain;
pub mod get;
pub mod label;
pub mod logs;
pub mod recreate;
pub mod set;
pub mod version;
pub mod wait;

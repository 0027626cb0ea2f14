//! The daemons' TOML configuration, parsed and validated as at start-up.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use rigger_agent::config::{AgentConfig, AgentConfigFile, RunArgs};
use rigger_controller::config::{ControllerArgs, ControllerConfig, ControllerConfigFile};
use rigger_daemon::config::parse_toml;

fuzz_target!(|text: &str| {
    if let Ok(file) = parse_toml::<AgentConfigFile>(Path::new("agent.toml"), text) {
        let _ = AgentConfig::from_layers(file, RunArgs::default());
    }
    if let Ok(file) = parse_toml::<ControllerConfigFile>(Path::new("controller.toml"), text) {
        let _ = ControllerConfig::from_layers(file, ControllerArgs::default());
    }
});

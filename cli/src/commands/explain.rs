//! `riggerctl explain KIND`: a kind's fields, types, defaults and meaning, and what
//! differs from OpenKruise (kubectl explain's place), from the types themselves; the
//! same page as `docs/reference/<kind>.md`. Needs no controller.

use rigger_api::Kind;

/// Show a kind's reference: every field, its type, default and meaning.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// imagepulljob, imagelistpulljob, containerrecreaterequest (crr), sidecarset,
    /// nodeimage, pod, secret, lifecyclecooperator.
    kind: String,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let kind = Kind::parse(&args.kind)?;
    let page = rigger_api::reference::page(kind).ok_or_else(|| {
        let documented: Vec<String> = rigger_api::reference::documented()
            .map(|k| k.name().to_ascii_lowercase())
            .collect();
        anyhow::anyhow!(
            "{kind} has no reference page yet (explained: {})",
            documented.join(", ")
        )
    })?;
    print!("{page}");
    Ok(())
}

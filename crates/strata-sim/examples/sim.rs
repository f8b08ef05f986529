//! Run `strata sim` without the `strata` binary: `cargo run --release -p strata-sim
//! --example sim -- TRACE --policy ...` (the lead mounts `SimArgs` under `strata sim`).

use clap::Parser;

#[derive(Parser)]
#[command(name = "strata-sim")]
struct Cli {
    #[command(flatten)]
    args: strata_sim::cli::SimArgs,
}

fn main() -> anyhow::Result<()> {
    strata_sim::cli::run(Cli::parse().args)
}

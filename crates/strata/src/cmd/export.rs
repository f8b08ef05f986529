//! `strata export add|remove`: change what a running server offers, through its admin
//! endpoint, without a restart. Exports added this way last until the server stops; put them
//! in the config file to keep them.

use crate::http;
use anyhow::Result;
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
#[command(after_help = "\
Examples:
  strata export add --admin 127.0.0.1:9810 snap1=/var/tmp/snap1.img
  strata export add --admin 127.0.0.1:9810 --read-only old=cache:/var/tmp/c.img
  strata export remove --admin 127.0.0.1:9810 snap1
  strata export remove --admin 127.0.0.1:9810 --force snap1   (closes its connections)")]
pub struct ExportArgs {
    #[command(subcommand)]
    pub command: ExportCommand,
}

#[derive(Subcommand, Debug)]
pub enum ExportCommand {
    /// Open a device spec and offer it as a new export.
    Add {
        /// The server's admin endpoint (as given to `strata serve --admin`).
        #[arg(long, value_name = "HOST:PORT")]
        admin: String,
        /// Export it read-only.
        #[arg(long)]
        read_only: bool,
        /// The export, as NAME=SPEC (the specs of `strata serve --help`).
        #[arg(value_name = "NAME=SPEC")]
        volume: String,
    },
    /// Stop offering an export, flush its device and close it.
    Remove {
        /// The server's admin endpoint (as given to `strata serve --admin`).
        #[arg(long, value_name = "HOST:PORT")]
        admin: String,
        /// Remove it even while clients are connected: their in-flight requests finish,
        /// then their connections close.
        #[arg(long)]
        force: bool,
        name: String,
    },
}

pub fn run(args: ExportArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let answer = rt.block_on(async {
        match &args.command {
            ExportCommand::Add { admin, read_only, volume } => {
                crate::cmd::serve::parse_named(volume).map_err(anyhow::Error::msg)?;
                http::add_export(admin, volume, *read_only).await
            }
            ExportCommand::Remove { admin, force, name } => http::remove_export(admin, name, *force).await,
        }
    })?;
    print!("{answer}");
    Ok(())
}

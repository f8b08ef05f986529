use clap::{Parser, Subcommand};
use strata::cmd;

/// strata: a userspace hybrid block-storage engine served over NBD.
#[derive(Parser)]
#[command(
    name = "strata",
    version,
    propagate_version = true,
    after_help = "\
Examples:
  strata serve --unix /tmp/strata.sock vol0=/var/tmp/vol0.img?size=4GiB
  strata status --admin 127.0.0.1:9810
  strata cache create --origin hdd:/var/tmp/origin.img --cache /var/tmp/cache.img?size=1GiB
  strata thin pool create --metadata /var/tmp/pool.meta?size=64MiB --data /var/tmp/pool.data?size=100GiB
  strata sim ../shared/testdata/cloudphysics-w.csv --policy optgate,strata,lru --size 1%,10%
Run `strata <command> --help` for each command's options."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve a demo volume and drive it with fio, showing live progress.
    Demo(cmd::demo::DemoArgs),
    /// Serve volumes over NBD (Unix socket and/or TCP).
    Serve(cmd::serve::ServeArgs),
    /// Show what a running server is doing (from its --admin endpoint).
    Status(cmd::status::StatusArgs),
    /// Add or remove exports of a running server (through its --admin endpoint).
    Export(cmd::export::ExportArgs),
    /// Create, tune, flush, detach, check and dump caches.
    Cache(cmd::cache::CacheArgs),
    /// Create, tune, flush, detach, check and dump write logs (the writecache target).
    Writecache(cmd::writecache::WritecacheArgs),
    /// Make thin pools (dm-thin's metadata format); create, snapshot, delete, list, check and dump thin volumes.
    Thin(cmd::thin::ThinArgs),
    /// Share a disk's time between groups of volumes: calibrate a device, show and change groups.
    Qos(cmd::qos::QosArgs),
    /// Replay a block trace (or a synthetic workload) through cache policies.
    Sim(cmd::sim::SimArgs),
    /// Crash a cache, a write log or a thin volume at seeded points and count lost writes.
    Crashtest(cmd::crashtest::CrashtestArgs),
    /// Drive an NBD export with random IO, FUA on every write if asked (benchmarks' sync rows).
    Load(cmd::load::LoadArgs),
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Demo(_) | Command::Serve(_) | Command::Crashtest(_) | Command::Load(_)) {
        // Commands that print, as Unix tools do, end quietly when their reader goes away
        // (`strata thin dump POOL | head`) rather than panicking on a write to a closed pipe.
        // Those that serve or drive NBD connections keep ignoring SIGPIPE: a client hanging
        // up must be an error on its socket, not the end of the process.
        // SAFETY: no preconditions; set before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Cache(a) => cmd::cache::run(a),
        Command::Writecache(a) => cmd::writecache::run(a),
        Command::Thin(a) => cmd::thin::run(a),
        Command::Qos(a) => cmd::qos::run(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Crashtest(a) => cmd::crashtest::run(a),
        Command::Load(a) => cmd::load::run(a),
    };
    if let Err(e) = result {
        eprintln!("strata: error: {e:#}");
        std::process::exit(if e.downcast_ref::<cmd::NotChecked>().is_some() { 2 } else { 1 });
    }
}

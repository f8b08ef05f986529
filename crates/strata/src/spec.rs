//! Device specs: how a device, or a stack of targets over devices, is named on the command
//! line and in config files. A spec is parsed once into a `Spec`, printed back in one
//! canonical form (`Display`: options in a fixed order, only those that differ from their
//! defaults), and opened into a stack of `BlockDev`s by `crate::open`. Targets take devices
//! already opened and never see these strings.
//!
//! - `PATH[?opts]` — a file or block device. Options: `size=4GiB` (create a sparse file of
//!   that size if missing), `direct=on|off`, `engine=uring|pool`, `ro`, `shared` (with `ro`
//!   only: no claim on the file, to read beside a writer; see `strata_io::file`)
//! - `mem:SIZE` — RAM (up to 1 PiB)
//! - `hdd:PATH[?opts]` — `PATH` behind the HDD latency model; the file's options plus
//!   `seek_min_ms`, `seek_max_ms`, `rpm`, `mib_s`, `seed` (within the bounds
//!   `strata_io::query::take_hdd` states)
//! - `ssd:PATH[?opts]` — `PATH` behind the SSD model; the file's options plus `read_us`,
//!   `write_us`, `channels`, `mib_s` (within the same bounds)
//! - `fault:RULE[,RULE]...@SPEC` — the device `SPEC` names, behind the fault-injection device,
//!   with rules in the text form `strata_io::fault::parse_rule` reads, e.g.
//!   `fault:read:eio:0-1MiB:once,flush:eio:after=10@/var/tmp/o.img`
//! - `cache:PATH[?origin=SPEC]` — a cache made by `strata cache create`; its superblock
//!   records the spec of its origin, which `origin=` overrides. Everything after `origin=` is
//!   the origin's spec, its own options included, so `origin=` comes last:
//!   `cache:/var/tmp/c.img?origin=hdd:/var/tmp/o.img?rpm=5400&seek_max_ms=12`.
//! - `writecache:PATH[?origin=SPEC]` — a write log made by `strata writecache create`; like
//!   `cache:`, its superblock records its origin's spec, which `origin=` overrides (last).
//! - `thin:POOL?id=N[&size=S][&skip_block_zeroing][&low_water_blocks=N][&commit_period_ms=N][&data=SPEC]` —
//!   thin volume `N` of the pool whose metadata
//!   device is `POOL` (made by `strata thin pool create`, or by thin-provisioning-tools or the
//!   kernel). `data=` names the pool's data device, else the spec strata recorded in the
//!   pool's superblock is used; `size=` the volume's size, else its recorded size (a pool
//!   made by other tools records none); `skip_block_zeroing` (a pool feature: every volume
//!   of a pool served together must say the same) leaves old data in the rest of a newly
//!   provisioned block; `low_water_blocks` and `commit_period_ms` set the pool's low-water
//!   mark and commit period (dm-thin's; as `strata thin set`). Everything after `data=` is
//!   the data device's spec,
//!   so `data=` comes last, except that a data spec without options of its own may be
//!   followed by `&id=N&size=S`: `thin:/m.img?data=/d.img&id=1`.
//! - `slice:OFFSET+SIZE[?overlap]@SPEC` — `SIZE` bytes of the device `SPEC` names from
//!   `OFFSET` (dm-linear; both multiples of 512 bytes), e.g. `slice:0+200GiB@hdd:/d.img`.
//!   Slices of one device in one server share one open device and may not overlap unless
//!   each says `overlap`.
//! - `qos:GROUP[?opts]@SPEC` — the volume `SPEC` names, in the IO controller's group `GROUP`.
//!   Every `qos:` volume of one server whose spec ends in the same device (below its slices)
//!   shares that device's time by weight with the others. Group options: `weight` (1-10000,
//!   default 100), caps `riops`, `wiops`, `rbps`, `wbps` (`max` lifts one), `burst_ms`,
//!   `latency_ms`; device options (the same in every spec naming the device): `model`,
//!   `depth`, `slice_ms`, `idle_ms`, `max_wait_ms`. See docs/QOS.md.
//! - `nbd://HOST[:PORT]/EXPORT[?opts]`, `nbd+unix:///EXPORT?socket=PATH[&opts]` — an export
//!   of a remote NBD server (`strata_nbd::remote`); `nbds://` and `nbds+unix://` over TLS.
//!   Options: `connections=N`, `timeout=30s` (one attempt), `outage=180s` (how long a
//!   request waits for a server that is away), `replay=64MiB` (unflushed writes kept to
//!   write again after a reconnect); with TLS `tls-psk-file=PATH`, `tls-username=ID`,
//!   `tls-certificates=DIR`, `tls-verify=off`.
//!
//! A word before the first `:` that names no kind (`foo:bar`) is refused with the list of
//! kinds, unless a file of that name exists: a typo in a prefix should not read as a missing
//! file. (`./foo:bar` names a file to be created.)
//!
//! Adding a target (a write-log cache, thin volumes, an IO controller, a remote origin) adds:
//! 1. a variant of `Spec` holding, typed, what its spec says (devices it stacks on as `Spec`s);
//! 2. its prefix in `KINDS`, an arm in `Spec::parse` and one in `Display` (and a case in the
//!    round-trip test's generator);
//! 3. an arm in `crate::open::open` that opens what it stacks on and hands the devices to the
//!    target's constructor.
//!
//! Nothing else: the commands take a `Spec` and call `open`. `identity` and `recordable` need
//! an arm of their own only if the new variant names a file itself.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use strata_io::engine::{EngineKind, DEFAULT_ENGINE};
use strata_io::fault::{parse_rule, Rule};
use strata_io::file::FileOptions;
use strata_io::latency::{HddParams, SsdParams};
use strata_io::query::{self, invalid_spec, percent_decode, split_query, Options, Written};
use strata_io::units::{format_size_exact, parse_duration, parse_size, parse_volume_size, volume_size, DurationError};
use strata_io::{Error, ErrorKind, Result};
use strata_qos::QosOptions;

use strata_nbd::remote::{Address, RemoteSpec, Tuning, DEFAULT_PORT};
use strata_nbd::tls::ClientTls;

/// The kinds of spec, as an error lists them.
pub const KINDS: &str =
    "file path, mem:, hdd:, ssd:, fault:, cache:, writecache:, thin:, slice:, qos:, nbd://, nbd+unix://, nbds://, nbds+unix://";

/// A device or a stack of targets, as a spec names it.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// `PATH[?opts]`
    File(FileSpec),
    /// `mem:SIZE`
    Mem { bytes: u64 },
    /// `hdd:PATH[?opts]`
    Hdd { file: FileSpec, params: HddParams },
    /// `ssd:PATH[?opts]`
    Ssd { file: FileSpec, params: SsdParams },
    /// `fault:RULES@SPEC`
    Fault { rules: Vec<Rule>, inner: Box<Spec> },
    /// `cache:PATH[?origin=SPEC]`; without `origin` the superblock's recorded spec is used.
    Cache { path: PathBuf, origin: Option<Box<Spec>> },
    /// `writecache:PATH[?origin=SPEC]`; without `origin` the superblock's recorded spec is used.
    Writecache { path: PathBuf, origin: Option<Box<Spec>> },
    /// `thin:POOL?id=N[&size=S][&skip_block_zeroing][&low_water_blocks=N][&commit_period_ms=N][&data=SPEC]`
    Thin {
        pool: PathBuf,
        id: u32,
        size: Option<u64>,
        skip_zeroing: bool,
        /// The pool's low-water mark and commit period, set when the spec opens it.
        low_water: Option<u64>,
        commit_period_ms: Option<u64>,
        data: Option<Box<Spec>>,
    },
    /// `slice:OFFSET+SIZE[?overlap]@SPEC`
    Slice { offset: u64, len: u64, overlap: bool, inner: Box<Spec> },
    /// `qos:GROUP[?opts]@SPEC`
    Qos { group: String, options: Box<QosOptions>, inner: Box<Spec> },
    /// `nbd://`, `nbd+unix://`, `nbds://`, `nbds+unix://`
    Nbd(Box<RemoteSpec>),
}

/// A file or block device and the options it opens with.
#[derive(Debug, Clone, PartialEq)]
pub struct FileSpec {
    pub path: PathBuf,
    /// `size=`: create a sparse file of this size if the path does not exist.
    pub size: Option<u64>,
    /// `direct=`: try O_DIRECT.
    pub direct: bool,
    /// `engine=`
    pub engine: EngineKind,
    /// `ro`
    pub ro: bool,
    /// `shared` (only with `ro`): take no claim on the file.
    pub shared: bool,
}

impl FileSpec {
    /// `path` with every option at its default.
    pub fn new(path: impl Into<PathBuf>) -> FileSpec {
        FileSpec {
            path: path.into(),
            size: None,
            direct: FileOptions::default().direct,
            engine: DEFAULT_ENGINE,
            ro: false,
            shared: false,
        }
    }

    /// Reads `PATH[?opts]` and the file's options; the caller takes its own options from
    /// what is left, then calls `finish`.
    fn parse(spec: &str, text: &str) -> Result<(FileSpec, Options)> {
        let (path, q) = split_query(text);
        if path.is_empty() {
            return Err(invalid_spec(spec, "no path"));
        }
        let mut opts = Options::parse(spec, q);
        let mut f = FileSpec::new(path);
        f.size = opts.take_size("size")?.map(volume_size).transpose().map_err(|e| invalid_spec(spec, &e))?;
        f.direct = opts.take_bool("direct")?.unwrap_or(f.direct);
        f.engine = opts.take_parsed("engine")?.unwrap_or(f.engine);
        f.ro = opts.take_bool("ro")? == Some(true);
        f.shared = opts.take_bool("shared")? == Some(true);
        if f.shared && !f.ro {
            return Err(
                opts.invalid("shared is only allowed with ro (?ro&shared): an open that takes no claim must not write")
            );
        }
        Ok((f, opts))
    }

    /// The file's options that differ from the defaults, in `parse`'s order.
    fn written(&self) -> Written {
        let d = FileSpec::new("");
        let mut w = Written::default();
        if let Some(size) = self.size {
            w.pair("size", format_size_exact(size));
        }
        if self.direct != d.direct {
            w.pair("direct", if self.direct { "on" } else { "off" });
        }
        if self.engine != d.engine {
            w.pair("engine", engine_name(self.engine));
        }
        w.flag("ro", self.ro);
        w.flag("shared", self.shared);
        w
    }
}

fn engine_name(e: EngineKind) -> &'static str {
    match e {
        EngineKind::Uring => "uring",
        EngineKind::Pool => "pool",
    }
}

/// How deep specs may nest (`fault:`, `slice:`, `qos:` in one another, a cache's origin, a
/// pool's data device): far past any real stack, well short of the parser's own.
const MAX_NESTING: usize = 32;

impl Spec {
    /// Parses a spec (see the module docs); errors name the spec and what is wrong with it.
    pub fn parse(s: &str) -> Result<Spec> {
        Spec::parse_at(0, s)
    }

    /// [`Spec::parse`] of a spec nested `depth` deep in another.
    fn parse_at(depth: usize, s: &str) -> Result<Spec> {
        if depth > MAX_NESTING {
            return Err(invalid_spec(s, format!("specs nest at most {MAX_NESTING} deep")));
        }
        let invalid = |msg: String| invalid_spec(s, msg);
        let Some((kind, rest)) = s.split_once(':') else { return Spec::file(s) };
        match kind {
            "mem" => {
                let bytes = parse_volume_size(rest).map_err(invalid)?;
                if bytes > strata_io::mem::MAX_BYTES {
                    return Err(invalid(format!(
                        "a mem: device holds at most 1 PiB, not {}",
                        format_size_exact(bytes)
                    )));
                }
                Ok(Spec::Mem { bytes })
            }
            "hdd" => {
                let (file, mut opts) = FileSpec::parse(s, rest)?;
                let params = query::take_hdd(&mut opts)?;
                opts.finish()?;
                Ok(Spec::Hdd { file, params })
            }
            "ssd" => {
                let (file, mut opts) = FileSpec::parse(s, rest)?;
                let params = query::take_ssd(&mut opts)?;
                opts.finish()?;
                Ok(Spec::Ssd { file, params })
            }
            "fault" => {
                let (rules, inner) = split_stacked(s, rest, "fault:RULE[,RULE]...@SPEC")?;
                let rules: std::result::Result<Vec<Rule>, String> = rules.split(',').map(parse_rule).collect();
                Ok(Spec::Fault { rules: rules.map_err(invalid)?, inner: Box::new(Spec::parse_at(depth + 1, inner)?) })
            }
            "slice" => {
                let (head, inner) = split_stacked(s, rest, "slice:OFFSET+SIZE@SPEC")?;
                let (range, q) = split_query(head);
                let mut opts = Options::parse(s, q);
                let overlap = opts.take_bool("overlap")? == Some(true);
                opts.finish()?;
                let (offset, len) =
                    range.split_once('+').ok_or_else(|| invalid("expected slice:OFFSET+SIZE@SPEC".into()))?;
                let (offset, len) = (parse_size(offset).map_err(invalid)?, parse_volume_size(len).map_err(invalid)?);
                // As dm-linear's: on a sector boundary, or every request of the slice is a
                // read-modify-write of the device's sectors, each alone.
                if !offset.is_multiple_of(512) {
                    return Err(invalid(format!("a slice's offset must be a multiple of 512 bytes, not {offset}")));
                }
                if offset.checked_add(len).is_none() {
                    return Err(invalid("the slice ends past 2^64".into()));
                }
                Ok(Spec::Slice { offset, len, overlap, inner: Box::new(Spec::parse_at(depth + 1, inner)?) })
            }
            "qos" => {
                let (head, inner) = split_stacked(s, rest, "qos:GROUP[?opts]@SPEC")?;
                let (group, q) = split_query(head);
                if group.is_empty()
                    || group.len() > 64
                    || !group.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                {
                    return Err(invalid(format!(
                        "group name {group:?}: expected 1 to 64 letters, digits, '_', '-' or '.'"
                    )));
                }
                let mut opts = Options::parse(s, q);
                let options = QosOptions::take(&mut opts)?;
                opts.finish()?;
                Ok(Spec::Qos {
                    group: group.to_string(),
                    options: Box::new(options),
                    inner: Box::new(Spec::parse_at(depth + 1, inner)?),
                })
            }
            "cache" | "writecache" => {
                let (path, q) = split_query(rest);
                if path.is_empty() {
                    return Err(invalid("no path".into()));
                }
                let (others, origin) = split_nested(q.unwrap_or(""), "origin=");
                Options::parse(s, Some(&others)).finish()?;
                let origin = match origin {
                    None => None,
                    Some("") => return Err(invalid("no spec after origin=".into())),
                    Some(o) => Some(Box::new(Spec::parse_at(depth + 1, o)?)),
                };
                Ok(if kind == "cache" {
                    Spec::Cache { path: path.into(), origin }
                } else {
                    Spec::Writecache { path: path.into(), origin }
                })
            }
            "thin" => {
                let (pool, q) = split_query(rest);
                if pool.is_empty() {
                    return Err(invalid("no pool metadata path".into()));
                }
                let (mut others, data) = split_nested(q.unwrap_or(""), "data=");
                let data = match data {
                    None => None,
                    Some("") => return Err(invalid("no spec after data=".into())),
                    // A data spec without options of its own leaves later options to thin.
                    Some(d) if !d.contains('?') && d.contains('&') => {
                        let (d, more) = d.split_once('&').unwrap();
                        others = [others.as_str(), more]
                            .iter()
                            .filter(|x| !x.is_empty())
                            .copied()
                            .collect::<Vec<_>>()
                            .join("&");
                        Some(Box::new(Spec::parse_at(depth + 1, d)?))
                    }
                    Some(d) => Some(Box::new(Spec::parse_at(depth + 1, d)?)),
                };
                let mut opts = Options::parse(s, Some(&others));
                let id: u32 = opts.take_parsed("id")?.ok_or_else(|| invalid("no volume id= given".into()))?;
                if id >= 1 << 24 {
                    return Err(invalid(format!("volume id {id} out of range (0 to 16777215)")));
                }
                let size = opts.take_size("size")?.map(volume_size).transpose().map_err(invalid)?;
                let skip_zeroing = opts.take_bool("skip_block_zeroing")? == Some(true);
                let low_water = opts.take_parsed("low_water_blocks")?;
                let commit_period_ms =
                    opts.take_within("commit_period_ms", 0, strata_thin::pool::COMMIT_PERIOD_MAX_MS, " ms")?;
                opts.finish()?;
                Ok(Spec::Thin { pool: pool.into(), id, size, skip_zeroing, low_water, commit_period_ms, data })
            }
            "nbd" | "nbds" | "nbd+unix" | "nbds+unix" => parse_nbd(s, kind, rest),
            _ if looks_like_kind(kind) && !may_exist(Path::new(split_query(s).0)) => {
                Err(invalid(format!("unknown device kind {kind:?} ({KINDS})")))
            }
            _ => Spec::file(s),
        }
    }

    fn file(s: &str) -> Result<Spec> {
        let (file, opts) = FileSpec::parse(s, s)?;
        opts.finish()?;
        Ok(Spec::File(file))
    }

    /// The spec to record for opening this device again later: every `size=` dropped, so
    /// that a reopen never creates an empty device in place of a lost one, and every path
    /// made absolute, so that a reopen from another working directory (a service's, `/`)
    /// finds the same file.
    pub fn recordable(&self) -> Spec {
        let mut s = self.clone();
        s.for_each_file(&mut |f| {
            f.size = None;
            if let Ok(path) = std::path::absolute(&f.path) {
                f.path = path;
            }
        });
        s
    }

    fn for_each_file(&mut self, each: &mut dyn FnMut(&mut FileSpec)) {
        match self {
            Spec::File(f) | Spec::Hdd { file: f, .. } | Spec::Ssd { file: f, .. } => each(f),
            Spec::Fault { inner, .. } | Spec::Slice { inner, .. } | Spec::Qos { inner, .. } => {
                inner.for_each_file(each)
            }
            Spec::Cache { origin, .. } | Spec::Writecache { origin, .. } | Spec::Thin { data: origin, .. } => {
                if let Some(o) = origin {
                    o.for_each_file(each)
                }
            }
            Spec::Mem { .. } | Spec::Nbd(_) => {}
        }
    }

    /// The files opening this spec would create: paths given `size=` that do not exist yet.
    fn files_to_create(&self) -> Vec<PathBuf> {
        let mut new = Vec::new();
        self.clone().for_each_file(&mut |f| {
            if f.size.is_some() && std::fs::symlink_metadata(&f.path).is_err() {
                new.push(f.path.clone());
            }
        });
        new
    }

    /// Whether the spec opens its device read-only by itself (`ro` on the file it ends in):
    /// such a volume is exported read-only.
    pub fn read_only(&self) -> bool {
        match self {
            Spec::File(f) | Spec::Hdd { file: f, .. } | Spec::Ssd { file: f, .. } => f.ro,
            Spec::Fault { inner, .. } | Spec::Slice { inner, .. } | Spec::Qos { inner, .. } => inner.read_only(),
            _ => false,
        }
    }

    /// Whether the device lives in RAM (`mem:`, or a wrapper of one).
    fn in_ram(&self) -> bool {
        match self {
            Spec::Mem { .. } => true,
            Spec::Fault { inner, .. } | Spec::Slice { inner, .. } | Spec::Qos { inner, .. } => inner.in_ram(),
            _ => false,
        }
    }

    /// The file or block device this spec's device is the whole of, if any (not a slice).
    fn whole_file(&self) -> Option<&Path> {
        match self {
            Spec::File(f) | Spec::Hdd { file: f, .. } | Spec::Ssd { file: f, .. } => Some(&f.path),
            Spec::Fault { inner, .. } | Spec::Qos { inner, .. } => inner.whole_file(),
            _ => None,
        }
    }

    /// The file or block device this spec's device lives on, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Spec::File(f) | Spec::Hdd { file: f, .. } | Spec::Ssd { file: f, .. } => Some(&f.path),
            Spec::Fault { inner, .. } | Spec::Slice { inner, .. } | Spec::Qos { inner, .. } => inner.path(),
            Spec::Cache { path, .. } | Spec::Writecache { path, .. } | Spec::Thin { pool: path, .. } => Some(path),
            Spec::Mem { .. } | Spec::Nbd(_) => None,
        }
    }

    /// What tells this device apart from another at the same path, recorded by a cache for
    /// its origin: `DEV:INODE` of a file; of a block device its number, size and what the
    /// kernel says it is (`block_identity`); empty for RAM, or when the file cannot be read
    /// now (then nothing is compared).
    pub fn identity(&self) -> String {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        match self.path().map(std::fs::metadata) {
            Some(Ok(m)) if m.file_type().is_file() => format!("{}:{}", m.dev(), m.ino()),
            Some(Ok(m)) if m.file_type().is_block_device() => block_identity(m.rdev()),
            Some(Ok(m)) => format!("rdev {}", m.rdev()),
            _ => String::new(),
        }
    }

    /// Whether this device is the one whose identity was `recorded`: `None` if so (or if
    /// either is unknown), else its identity now. Of a block device only the fields recorded
    /// are compared, so an origin recorded before a field was added still matches.
    pub fn identity_mismatch(&self, recorded: &str) -> Option<String> {
        let now = self.identity();
        identities_differ(recorded, &now).then_some(now)
    }
}

/// Whether identity `now` is not the `recorded` one (see `Spec::identity_mismatch`).
fn identities_differ(recorded: &str, now: &str) -> bool {
    if recorded.is_empty() || now.is_empty() || now == recorded {
        return false;
    }
    let fields = |id: &str| -> Vec<(String, String)> {
        id.split("; ")
            .map(|f| f.split_once(' ').map_or((f.into(), String::new()), |(k, v)| (k.into(), v.into())))
            .collect()
    };
    let have = fields(now);
    !(recorded.starts_with("rdev ") && fields(recorded).iter().all(|f| have.contains(f)))
}

/// A block device's identity: its number, its size in bytes, and where the kernel knows one,
/// what it is beyond the number, which the kernel hands to the next device attached: a loop
/// device's backing file (`loop DEV:INODE`), a device-mapper device's UUID (`dm UUID`, an LVM
/// volume's), a disk's WWID or serial; a partition also its start. Fields are joined by "; ".
fn block_identity(rdev: u64) -> String {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let sys = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let read = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let mut out = format!("rdev {rdev}");
    if let Some(sectors) = read(&sys.join("size")) {
        out += &format!("; size {}", sectors.parse::<u64>().unwrap_or(0) * 512);
    }
    // A partition's own identity is its disk's and where it starts.
    let (disk, start) = match read(&sys.join("start")) {
        Some(start) if sys.join("partition").exists() => (sys.join(".."), Some(start)),
        _ => (sys.clone(), None),
    };
    let backing = read(&disk.join("loop/backing_file")).map(|f| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&f).map_or(f, |m| format!("{}:{}", m.dev(), m.ino()))
    });
    let id = [
        backing.map(|b| format!("loop {b}")),
        read(&disk.join("dm/uuid")).map(|u| format!("dm {u}")),
        read(&disk.join("wwid")).or_else(|| read(&disk.join("device/wwid"))).map(|w| format!("wwid {w}")),
        read(&disk.join("serial")).or_else(|| read(&disk.join("device/serial"))).map(|s| format!("serial {s}")),
    ]
    .into_iter()
    .flatten()
    .next();
    for field in [id, start.map(|s| format!("start {s}"))].into_iter().flatten() {
        out += "; ";
        out += &field.replace("; ", " ");
    }
    out
}

/// Splits a stacking target's `WORDS@SPEC` (its own words, then the spec of the device it
/// stacks on) at the first `@`.
fn split_stacked<'a>(s: &str, rest: &'a str, usage: &str) -> Result<(&'a str, &'a str)> {
    let (head, inner) = rest.split_once('@').ok_or_else(|| invalid_spec(s, format!("expected {usage}")))?;
    if inner.is_empty() {
        return Err(invalid_spec(s, "no device after '@'"));
    }
    Ok((head, inner))
}

/// Reads an `nbd:` spec's duration: `30`, `30s`, `500ms`, `2m` (seconds when no unit).
fn duration_secs(s: &str) -> std::result::Result<std::time::Duration, String> {
    match parse_duration(s, Some("s")) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) | Err(DurationError::OutOfRange(_)) => Err(format!("a duration must be positive, got {s:?}")),
        Err(DurationError::NotANumber(_)) => Err(format!("expected a duration such as 30s or 500ms, got {s:?}")),
        Err(DurationError::Unit(unit)) => Err(format!("unknown unit {unit:?} in {s:?} (ms, s, m)")),
    }
}

/// Reads the part of an `nbd[s][+unix]:` spec after the kind.
fn parse_nbd(s: &str, kind: &str, rest: &str) -> Result<Spec> {
    let invalid = |msg: &str| invalid_spec(s, msg);
    let unix = kind.ends_with("+unix");
    let rest = rest.strip_prefix("//").ok_or_else(|| invalid(&format!("expected {kind}://...")))?;
    let (body, q) = split_query(rest);
    let mut opts = Options::parse(s, q);
    let (authority, export) = body.split_once('/').unwrap_or((body, ""));
    // The export name and the values of the URI's own options are percent-encoded.
    let export = percent_decode(export).map_err(|e| invalid(&format!("export name: {e}")))?;
    let take = |opts: &mut Options, key: &str| -> Result<Option<String>> {
        opts.take(key).map(|v| percent_decode(&v).map_err(|e| invalid(&format!("{key}: {e}")))).transpose()
    };
    let address = if unix {
        if !authority.is_empty() {
            return Err(invalid("a Unix socket URI has no host: nbd+unix:///EXPORT?socket=PATH"));
        }
        let socket = take(&mut opts, "socket")?.filter(|p| !p.is_empty());
        Address::Unix(socket.ok_or_else(|| invalid("no socket=PATH"))?.into())
    } else {
        let (host, port) = match authority.strip_prefix('[') {
            Some(v6) => {
                let (host, after) = v6.split_once(']').ok_or_else(|| invalid("unclosed '[' in the host"))?;
                (host, after.strip_prefix(':'))
            }
            None => match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            },
        };
        if host.is_empty() {
            return Err(invalid("no host"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p.parse().map_err(|_| invalid(&format!("bad port {p:?}")))?,
        };
        Address::Tcp { host: host.to_string(), port }
    };
    let d = Tuning::default();
    let duration = |opts: &mut Options, key: &str, default| match opts.take(key) {
        None => Ok(default),
        Some(v) => duration_secs(&v).map_err(|e| invalid_spec(s, format!("{key}: {e}"))),
    };
    // As many as a client sensibly opens (qemu and nbdcopy stop at 16 or fewer); more would
    // take the server's slots from its other clients.
    let connections = opts.take_within::<usize>("connections", 1, 64, "")?;
    let tuning = Tuning {
        connections,
        timeout: duration(&mut opts, "timeout", d.timeout)?,
        outage: duration(&mut opts, "outage", d.outage)?,
        replay_bytes: opts.take_size("replay")?.unwrap_or(d.replay_bytes),
    };
    let tls = ClientTls {
        psk_file: take(&mut opts, "tls-psk-file")?.map(PathBuf::from),
        username: take(&mut opts, "tls-username")?,
        certificates: take(&mut opts, "tls-certificates")?.map(PathBuf::from),
        verify: opts.take_bool("tls-verify")?.unwrap_or(true),
    };
    let secure = kind.starts_with("nbds");
    if !secure && tls != ClientTls::default() {
        return Err(invalid("tls-* options need TLS: nbds:// or nbds+unix://"));
    }
    if tls.psk_file.is_some() && tls.certificates.is_some() {
        return Err(invalid("give tls-psk-file or tls-certificates, not both"));
    }
    opts.finish()?;
    let spec = RemoteSpec { address, export, tls: secure.then_some(tls), tuning };
    Ok(Spec::Nbd(Box::new(spec)))
}

/// Splits a target's options into those before `key` (`origin=`, `data=`) and the nested
/// device's spec: everything after `key`, `&` and `?` included.
fn split_nested<'a>(q: &'a str, key: &str) -> (String, Option<&'a str>) {
    let mut others = Vec::new();
    let mut rest = q;
    loop {
        if let Some(origin) = rest.strip_prefix(key) {
            return (others.join("&"), Some(origin));
        }
        match rest.split_once('&') {
            Some((opt, more)) => {
                others.push(opt);
                rest = more;
            }
            None => {
                others.push(rest);
                return (others.join("&"), None);
            }
        }
    }
}

/// A bare word such as a kind would be (`nbd`, `thin`, `nbd+unix`), not a path's first part.
fn looks_like_kind(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_alphabetic())
        && word.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '_'))
}

/// False only when the path certainly does not exist.
fn may_exist(path: &Path) -> bool {
    !matches!(path.try_exists(), Ok(false))
}

impl FromStr for Spec {
    type Err = Error;
    fn from_str(s: &str) -> Result<Spec> {
        Spec::parse(s)
    }
}

/// The files a command's specs are about to create, removed again unless the command
/// [`keep`](NewFiles::keep)s them: a `create` that fails leaves no file behind for its retry
/// to refuse as "exists with another size".
pub struct NewFiles(Vec<PathBuf>);

impl NewFiles {
    /// Notes, before anything is opened, which of `specs`' files do not exist yet.
    pub fn of<'a>(specs: impl IntoIterator<Item = &'a Spec>) -> NewFiles {
        NewFiles(specs.into_iter().flat_map(|s| s.files_to_create()).collect())
    }

    /// `of` the named `specs`, for a command that formats one of them for the others.
    /// Refuses two that name the same whole file (each would write over the other), and a
    /// device in RAM, gone when the server stops while the format made for it stays.
    pub fn to_format(specs: &[(&str, &Spec)]) -> Result<NewFiles> {
        if let Some((name, spec)) = specs.iter().find(|(_, s)| s.in_ram()) {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{name} {spec} is in RAM and gone when the server stops, while what this formats stays: give a file or block device"),
            ));
        }
        // A file not made yet is named by its directory's canonical path.
        let canonical = |p: &Path| match std::fs::canonicalize(p) {
            Ok(c) => Some(c),
            Err(_) => Some(std::fs::canonicalize(std::path::absolute(p).ok()?.parent()?).ok()?.join(p.file_name()?)),
        };
        let whole = |s: &Spec| s.whole_file().and_then(canonical);
        for (i, &(a, sa)) in specs.iter().enumerate() {
            for &(b, sb) in &specs[i + 1..] {
                if let Some(path) = whole(sa).filter(|p| whole(sb).as_ref() == Some(p)) {
                    return Err(Error::new(
                        ErrorKind::Invalid,
                        format!("{a} and {b} both name {}: each needs a device of its own", path.display()),
                    ));
                }
            }
        }
        Ok(NewFiles::of(specs.iter().map(|&(_, s)| s)))
    }

    /// The command succeeded: the files stay.
    pub fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for NewFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::File(file) => write!(f, "{}{}", file.path.display(), file.written()),
            Spec::Mem { bytes } => write!(f, "mem:{}", format_size_exact(*bytes)),
            Spec::Hdd { file, params } => {
                let mut w = file.written();
                query::write_hdd(&mut w, params);
                write!(f, "hdd:{}{w}", file.path.display())
            }
            Spec::Ssd { file, params } => {
                let mut w = file.written();
                query::write_ssd(&mut w, params);
                write!(f, "ssd:{}{w}", file.path.display())
            }
            Spec::Fault { rules, inner } => {
                let rules: Vec<String> = rules.iter().map(Rule::to_string).collect();
                write!(f, "fault:{}@{inner}", rules.join(","))
            }
            Spec::Cache { path, origin } | Spec::Writecache { path, origin } => {
                let kind = if matches!(self, Spec::Cache { .. }) { "cache" } else { "writecache" };
                write!(f, "{kind}:{}", path.display())?;
                match origin {
                    Some(o) => write!(f, "?origin={o}"),
                    None => Ok(()),
                }
            }
            Spec::Thin { pool, id, size, skip_zeroing, low_water, commit_period_ms, data } => {
                write!(f, "thin:{}?id={id}", pool.display())?;
                if let Some(size) = size {
                    write!(f, "&size={}", format_size_exact(*size))?;
                }
                if *skip_zeroing {
                    write!(f, "&skip_block_zeroing")?;
                }
                if let Some(n) = low_water {
                    write!(f, "&low_water_blocks={n}")?;
                }
                if let Some(n) = commit_period_ms {
                    write!(f, "&commit_period_ms={n}")?;
                }
                match data {
                    Some(d) => write!(f, "&data={d}"),
                    None => Ok(()),
                }
            }
            Spec::Slice { offset, len, overlap, inner } => {
                let mut w = Written::default();
                w.flag("overlap", *overlap);
                write!(f, "slice:{}+{}{w}@{inner}", format_size_exact(*offset), format_size_exact(*len))
            }
            Spec::Qos { group, options, inner } => {
                let mut w = Written::default();
                options.write(&mut w);
                write!(f, "qos:{group}{w}@{inner}")
            }
            Spec::Nbd(r) => r.write_uri(f, true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;
    use strata_io::fault::{Effect, Ops};
    use strata_io::ErrorKind;

    fn parse(s: &str) -> Spec {
        Spec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn refused(s: &str) -> String {
        let e = Spec::parse(s).expect_err(s);
        assert_eq!(e.kind, ErrorKind::Invalid, "{s}: {e}");
        e.context
    }

    #[test]
    fn the_accepted_syntax_and_its_canonical_form() {
        for (text, canonical) in [
            ("/var/tmp/v.img", "/var/tmp/v.img"),
            ("/var/tmp/v.img?size=4GiB", "/var/tmp/v.img?size=4GiB"),
            ("/v.img?size=4096&direct=on", "/v.img?size=4KiB"),
            ("/v.img?ro&direct=off&engine=pool", "/v.img?direct=off&engine=pool&ro"),
            ("/v.img?engine=io_uring&shared&ro=yes", "/v.img?ro&shared"),
            ("/v.img?size=1.5G", "/v.img?size=1536MiB"),
            ("/dir/a:b.img", "/dir/a:b.img"),
            ("relative.img", "relative.img"),
            ("mem:1GiB", "mem:1GiB"),
            ("mem:1536", "mem:1536"),
            ("mem:1GB", "mem:1000000000"),
            ("hdd:/o.img", "hdd:/o.img"),
            ("hdd:/o.img?rpm=7200&seek_max_ms=12&size=8GiB", "hdd:/o.img?size=8GiB&seek_max_ms=12"),
            ("hdd:/o.img?seed=7&mib_s=120.5&seek_min_ms=0.25", "hdd:/o.img?seek_min_ms=0.25&mib_s=120.5&seed=7"),
            ("ssd:/s.img?channels=4&direct=off", "ssd:/s.img?direct=off&channels=4"),
            ("ssd:/s.img?read_us=100&write_us=30&mib_s=900", "ssd:/s.img?read_us=100&write_us=30&mib_s=900"),
            ("fault:read:eio:0-1MiB:once,flush:eio@mem:4MiB", "fault:read:eio:0-1048576:once,flush:eio@mem:4MiB"),
            ("fault:write:enospc:after=100@/o.img?ro", "fault:write:enospc:after=100@/o.img?ro"),
            (
                "fault:any:delay=5ms:p=0.01:seed=3@fault:flush:eio@mem:1MiB",
                "fault:any:delay=5000us:p=0.01:seed=3@fault:flush:eio@mem:1MiB",
            ),
            ("cache:/c.img", "cache:/c.img"),
            ("cache:/c.img?origin=/o.img", "cache:/c.img?origin=/o.img"),
            (
                "cache:/c.img?origin=hdd:/o.img?rpm=5400&seek_max_ms=12",
                "cache:/c.img?origin=hdd:/o.img?seek_max_ms=12&rpm=5400",
            ),
            (
                "cache:/c.img?origin=fault:write:eio:after=100@/o.img",
                "cache:/c.img?origin=fault:write:eio:after=100@/o.img",
            ),
            ("cache:/c.img?origin=cache:/d.img?origin=mem:1GiB", "cache:/c.img?origin=cache:/d.img?origin=mem:1GiB"),
            ("writecache:/w.img", "writecache:/w.img"),
            ("writecache:/w.img?origin=cache:/c.img", "writecache:/w.img?origin=cache:/c.img"),
            ("writecache:/w.img?origin=hdd:/o.img?rpm=5400", "writecache:/w.img?origin=hdd:/o.img?rpm=5400"),
            ("thin:/m.img?id=1", "thin:/m.img?id=1"),
            ("thin:/m.img?size=1TiB&id=7", "thin:/m.img?id=7&size=1TiB"),
            ("thin:/m.img?data=/d.img&id=1&size=1GiB", "thin:/m.img?id=1&size=1GiB&data=/d.img"),
            ("thin:/m.img?id=2&data=/d.img?direct=off&size=8GiB", "thin:/m.img?id=2&data=/d.img?size=8GiB&direct=off"),
            ("thin:/m.img?id=3&data=ssd:/d.img?channels=4", "thin:/m.img?id=3&data=ssd:/d.img?channels=4"),
            ("thin:/m.img?skip_block_zeroing&id=4", "thin:/m.img?id=4&skip_block_zeroing"),
            ("thin:/m.img?data=/d.img&id=4&skip_block_zeroing=off", "thin:/m.img?id=4&data=/d.img"),
            (
                "thin:/m.img?commit_period_ms=500&id=5&low_water_blocks=100",
                "thin:/m.img?id=5&low_water_blocks=100&commit_period_ms=500",
            ),
            ("slice:0+200GiB@hdd:/d.img", "slice:0+200GiB@hdd:/d.img"),
            ("slice:1048576+4096?overlap=on@mem:2MiB", "slice:1MiB+4KiB?overlap@mem:2MiB"),
            ("slice:1G+1G@slice:512MiB+4GiB@/d.img", "slice:1GiB+1GiB@slice:512MiB+4GiB@/d.img"),
            ("qos:db@hdd:/d.img", "qos:db@hdd:/d.img"),
            (
                "qos:db?rbps=10MiB/s&weight=200&riops=max@slice:0+1GiB@hdd:/d.img",
                "qos:db?weight=200&riops=max&rbps=10MiB@slice:0+1GiB@hdd:/d.img",
            ),
            (
                "qos:b-1.x?latency_ms=20&depth=4&model=1,2,3,4,5,6&slice_ms=0@mem:1GiB",
                "qos:b-1.x?latency_ms=20&model=1,2,3,4,5,6&depth=4&slice_ms=0@mem:1GiB",
            ),
            ("nbd://example.com/vol", "nbd://example.com/vol"),
            ("nbd://example.com:10809/vol", "nbd://example.com/vol"),
            ("nbd://10.0.0.1:7000/", "nbd://10.0.0.1:7000/"),
            ("nbd://host", "nbd://host/"),
            ("nbd://[::1]:7000/a/b", "nbd://[::1]:7000/a/b"),
            ("nbd://h/v?timeout=5&outage=2m&connections=2", "nbd://h/v?connections=2&timeout=5s&outage=120s"),
            ("nbd://h/v?timeout=1500ms&replay=1GiB", "nbd://h/v?timeout=1500ms&replay=1GiB"),
            ("nbd+unix:///vol?socket=/run/s.sock", "nbd+unix:///vol?socket=/run/s.sock"),
            ("nbd+unix:///?socket=/s&outage=10s", "nbd+unix:///?socket=/s&outage=10s"),
            ("nbds://h/v?tls-psk-file=/k.psk&tls-username=bob", "nbds://h/v?tls-psk-file=/k.psk&tls-username=bob"),
            ("nbds+unix:///v?tls-certificates=/pki&socket=/s", "nbds+unix:///v?socket=/s&tls-certificates=/pki"),
            ("nbds://h/v?tls-verify=off", "nbds://h/v?tls-verify=off"),
            ("nbd://h/hello%20world", "nbd://h/hello%20world"),
            ("nbd://h/a%2fb%3F%25", "nbd://h/a/b%3F%25"),
            ("nbd+unix:///v?socket=/run/my%20s%26%3d.sock", "nbd+unix:///v?socket=/run/my%20s%26%3D.sock"),
            ("nbds://h/%C3%A9t%C3%A9?tls-username=b%20b", "nbds://h/%C3%A9t%C3%A9?tls-username=b%20b"),
            ("nbds://h/v?tls-psk-file=/k%23.psk", "nbds://h/v?tls-psk-file=/k%23.psk"),
            (
                "cache:/c.img?origin=nbd+unix:///v?socket=/s&timeout=2s",
                "cache:/c.img?origin=nbd+unix:///v?socket=/s&timeout=2s",
            ),
        ] {
            let spec = parse(text);
            assert_eq!(spec.to_string(), canonical, "{text}");
            assert_eq!(parse(canonical), spec, "{canonical}");
        }
    }

    #[test]
    fn what_each_spec_holds() {
        let mut f = FileSpec::new("/o.img");
        f.size = Some(8 << 30);
        let hdd = HddParams { rpm: 5400.0, seek_max_ms: 12.0, ..HddParams::default() };
        assert_eq!(parse("hdd:/o.img?size=8GiB&rpm=5400&seek_max_ms=12"), Spec::Hdd { file: f.clone(), params: hdd });
        let origin = parse("cache:/c.img?origin=hdd:/o.img?size=8GiB&rpm=5400&seek_max_ms=12");
        let hdd = Spec::Hdd { file: f, params: hdd };
        assert_eq!(origin, Spec::Cache { path: "/c.img".into(), origin: Some(Box::new(hdd)) });
        let Spec::Fault { rules, inner } = parse("fault:read:eio:0-1MiB:once,flush:eio@mem:4MiB") else { panic!() };
        assert_eq!(rules, [Rule::read_error(0..1 << 20).once(), Rule::flush_error()]);
        assert_eq!(*inner, Spec::Mem { bytes: 4 << 20 });
        let Spec::Nbd(r) = parse("nbd+unix:///hello%20world?socket=/run/a%26b.sock") else { panic!() };
        assert_eq!((r.export.as_str(), r.address.clone()), ("hello world", Address::Unix("/run/a&b.sock".into())));
        let Spec::Nbd(r) = parse("nbds://h/%C3%A9t%C3%A9?tls-psk-file=/k%20j.psk") else { panic!() };
        assert_eq!((r.export.as_str(), r.tls.unwrap().psk_file.unwrap()), ("été", "/k j.psk".into()));
        let Spec::File(ro) = parse("/v.img?ro&shared&direct=off&engine=pool") else { panic!() };
        assert!(ro.ro && ro.shared && !ro.direct && ro.engine == EngineKind::Pool && ro.size.is_none());
    }

    #[test]
    fn a_block_device_is_compared_on_the_fields_recorded() {
        let now = "rdev 1792; size 33554432; loop 65024:17";
        assert!(!identities_differ(now, now));
        assert!(!identities_differ("rdev 1792", now), "recorded before sizes and backing files were");
        assert!(!identities_differ("", now) && !identities_differ(now, ""), "unknown: nothing compared");
        assert!(identities_differ("rdev 1792; size 33554432; loop 65024:18", now), "another backing file");
        assert!(identities_differ("rdev 1792; size 67108864", now), "another size");
        assert!(identities_differ("rdev 1793", now), "another number");
        assert!(identities_differ("rdev 1792; serial X", now), "a field the device no longer has");
        assert!(identities_differ("65024:17", "65024:18"), "files: device and inode");
    }

    #[test]
    fn recordable_drops_every_create_size_and_makes_paths_absolute() {
        let spec = parse("cache:/c.img?origin=fault:flush:eio@hdd:/o.img?size=8GiB&ro&rpm=5400");
        assert_eq!(spec.recordable().to_string(), "cache:/c.img?origin=fault:flush:eio@hdd:/o.img?ro&rpm=5400");
        assert_eq!(parse("/o.img?size=1MiB").recordable().to_string(), "/o.img");
        assert_eq!(parse("mem:1MiB").recordable(), parse("mem:1MiB"));
        let here = std::env::current_dir().unwrap();
        assert_eq!(
            parse("slice:0+1MiB@hdd:o.img?size=8GiB").recordable().to_string(),
            format!("slice:0+1MiB@hdd:{}", here.join("o.img").display())
        );
    }

    /// A spec is parsed by recursion: nesting is capped long before the stack is (a spec of
    /// thousands of levels sent to the admin endpoint overflowed the server's stack).
    #[test]
    fn nesting_is_capped() {
        let nested = |n: usize, kind: &str| format!("{}mem:1MiB", kind.repeat(n));
        for kind in ["slice:0+512@", "fault:read:eio@", "qos:g@"] {
            assert!(matches!(
                parse(&nested(MAX_NESTING, kind)),
                Spec::Slice { .. } | Spec::Fault { .. } | Spec::Qos { .. }
            ));
            assert!(refused(&nested(MAX_NESTING + 1, kind)).contains("nest at most 32 deep"), "{kind}");
            assert!(refused(&nested(100_000, kind)).contains("nest at most 32 deep"), "{kind}");
        }
        let cache = (0..1_000).fold("mem:1MiB".to_string(), |inner, _| format!("cache:/c?origin={inner}"));
        assert!(refused(&cache).contains("nest at most 32 deep"));
    }

    #[test]
    fn errors_say_what_is_wrong() {
        for (text, why) in [
            ("", "no path"),
            ("?size=1MiB", "no path"),
            ("hdd:", "no path"),
            ("cache:?origin=/o.img", "no path"),
            ("writecache:?origin=/o.img", "no path"),
            ("writecache:/w.img?origin=", "no spec after origin="),
            ("writecache:/w.img?block_size=4K&origin=/o.img", "unknown option(s): block_size"),
            ("cache:/c.img?origin=", "no spec after origin="),
            ("cache:/c.img?ro&origin=/o.img", "unknown option(s): ro"),
            ("cache:/c.img?origin=/o.img?bogus=1", "unknown option(s): bogus"),
            ("/v.img?bogus=1&size=1MiB&other", "unknown option(s): bogus, other"),
            ("/v.img?shared", "shared is only allowed with ro"),
            ("/v.img?direct=maybe", "bad value \"maybe\" for direct (on or off)"),
            ("/v.img?engine=aio", "bad value \"aio\" for engine"),
            ("/v.img?size=lots", "expected a number"),
            ("hdd:/o.img?rpm=fast", "bad value \"fast\" for rpm"),
            ("ssd:/o.img?rpm=5400", "unknown option(s): rpm"),
            ("hdd:/o.img?rpm=5400&rpm=7200", "unknown option(s): rpm"),
            ("mem:lots", "expected a number"),
            ("mem:1000", "a positive multiple of 512 bytes"),
            ("slice:1000+4096@mem:1MiB", "offset must be a multiple of 512"),
            ("slice:0+1000@mem:1MiB", "a positive multiple of 512 bytes"),
            ("mem:0", "a positive multiple of 512 bytes"),
            ("mem:8000PiB", "a mem: device holds at most 1 PiB"),
            ("/v.img?size=10MB", "a positive multiple of 512 bytes"),
            ("thin:/m.img?id=1&size=1000", "a positive multiple of 512 bytes"),
            ("fault:read:eio", "expected fault:RULE[,RULE]...@SPEC"),
            ("fault:read:eio@", "no device after '@'"),
            ("fault:nope:eio@mem:1MiB", "unknown operation"),
            ("fault:@mem:1MiB", "unknown operation"),
            ("fault:read:boom@mem:1MiB", "expected an effect"),
            ("fault:read:eio:p=2@mem:1MiB", "probability"),
            ("fault:read:eio@mem:lots", "expected a number"),
            ("thin:?id=1", "no pool metadata path"),
            ("thin:/m.img", "no volume id= given"),
            ("thin:/m.img?id=x", "bad value \"x\" for id"),
            ("thin:/m.img?id=16777216", "out of range"),
            ("thin:/m.img?id=1&data=", "no spec after data="),
            ("thin:/m.img?id=1&ro", "unknown option(s): ro"),
            ("slice:0+1GiB", "expected slice:OFFSET+SIZE@SPEC"),
            ("slice:1GiB@/d.img", "expected slice:OFFSET+SIZE@SPEC"),
            ("slice:0+1GiB@", "no device after '@'"),
            ("slice:0+0@/d.img", "a positive multiple of 512 bytes"),
            ("slice:lots+1GiB@/d.img", "expected a number"),
            ("slice:16383PiB+2PiB@/d.img", "past 2^64"),
            ("slice:0+1GiB?shared@/d.img", "unknown option(s): shared"),
            ("qos:db", "expected qos:GROUP[?opts]@SPEC"),
            ("hdd:/h.img?rpm=0", "rpm=0 is out of range (60 to 1000000)"),
            ("ssd:/s.img?channels=0", "channels=0 is out of range (1 to 1024)"),
            ("thin:/m.img?id=1&commit_period_ms=3600001", "commit_period_ms=3600001 is out of range (0 to 3600000 ms)"),
            ("qos:db@", "no device after '@'"),
            ("qos:@mem:1MiB", "group name \"\""),
            ("qos:a/b@mem:1MiB", "group name \"a/b\""),
            ("qos:db?weight=0@mem:1MiB", "weight 0 is out of range (1 to 10000)"),
            ("qos:db?weight=10001@mem:1MiB", "weight 10001 is out of range"),
            ("qos:db?weight=heavy@mem:1MiB", "bad value \"heavy\" for weight"),
            ("qos:db?riops=0@mem:1MiB", "riops=0 would stop the group"),
            ("qos:db?model=1,2,3@mem:1MiB", "six figures, got 3"),
            ("qos:db?model=1,2,3,4,5,0@mem:1MiB", "expected six positive integers"),
            ("qos:db?depth=0@mem:1MiB", "depth=0"),
            ("nbd://h/e?connections=5000", "connections=5000 is out of range (1 to 64)"),
            ("qos:db?max_wait_ms=18446744073710@mem:1MiB", "max_wait_ms=18446744073710 is out of range (0 to 3600000 ms)"),
            ("qos:db?slice_ms=60001@mem:1MiB", "slice_ms=60001 is out of range (0 to 60000 ms)"),
            ("qos:db?idle_ms=60001@mem:1MiB", "idle_ms=60001 is out of range"),
            ("qos:db?colour=red@mem:1MiB", "unknown option(s): colour"),
            (
                "foo:bar",
                "unknown device kind \"foo\" (file path, mem:, hdd:, ssd:, fault:, cache:, writecache:, thin:, slice:, qos:, nbd://",
            ),
            ("nbd+unix:///vol", "no socket=PATH"),
            ("nbd+unix://host/vol?socket=/s", "has no host"),
            ("nbd:host/vol", "expected nbd://"),
            ("nbd:///vol", "no host"),
            ("nbd://h/v%zz", "export name: bad percent-escape"),
            ("nbd://h/v%4", "export name: bad percent-escape"),
            ("nbd://h/a%00b", "NUL"),
            ("nbd://h/%ff", "not decode to UTF-8"),
            ("nbd+unix:///v?socket=/s%", "socket: bad percent-escape"),
            ("nbd://h:port/v", "bad port"),
            ("nbd://[::1/v", "unclosed"),
            ("nbd://h/v?timeout=soon", "timeout: expected a duration"),
            ("nbd://h/v?outage=0", "must be positive"),
            ("nbd://h/v?connections=0", "connections=0 is out of range (1 to 64)"),
            ("nbd://h/v?tls-psk-file=/k", "need TLS"),
            ("nbds://h/v?tls-psk-file=/k&tls-certificates=/d", "not both"),
            ("nbd://h/v?bogus", "unknown option(s): bogus"),
        ] {
            let e = refused(text);
            assert!(e.contains(why), "{text:?}: {e}");
        }
        // The error names the spec it is about: the inner one when nested.
        assert!(refused("cache:/c.img?origin=mem:lots").starts_with("device spec \"mem:lots\""));
    }

    /// Paths: absolute, so that no first part can read as a kind; ':' and '@' allowed inside.
    fn path() -> impl Strategy<Value = PathBuf> {
        "(/[a-z0-9._:@-]{1,8}){1,3}".prop_map(PathBuf::from)
    }

    fn size() -> impl Strategy<Value = u64> {
        prop_oneof![0..1u64 << 52, (1..1u64 << 20).prop_map(|n| n << 20), (1..1u64 << 10).prop_map(|n| n << 30)]
    }

    /// A volume's size: a positive multiple of 512 bytes.
    fn volume_size() -> impl Strategy<Value = u64> {
        size().prop_map(|n| (n >> 9).max(1) << 9)
    }

    fn file() -> impl Strategy<Value = FileSpec> {
        let engine = prop_oneof![Just(EngineKind::Uring), Just(EngineKind::Pool)];
        (path(), proptest::option::of(volume_size()), any::<bool>(), engine, any::<bool>(), any::<bool>()).prop_map(
            |(path, size, direct, engine, ro, shared)| FileSpec {
                path,
                size,
                direct,
                engine,
                ro,
                shared: shared && ro,
            },
        )
    }

    /// Figures the models accept (`lo..=hi`), including the defaults (which print as nothing).
    fn figure(default: f64, lo: f64, hi: f64) -> impl Strategy<Value = f64> {
        let eighths = ((lo * 8.0) as u32..=(hi * 8.0) as u32).prop_map(|n| n as f64 / 8.0);
        prop_oneof![Just(default), lo..=hi, eighths]
    }

    fn hdd() -> impl Strategy<Value = HddParams> {
        let d = HddParams::default();
        let seed = prop_oneof![Just(d.seed), any::<u64>()];
        let (seek_min, seek_max) = (figure(d.seek_min_ms, 0.0, 1000.0), figure(d.seek_max_ms, 0.0, 1000.0));
        (seek_min, seek_max, figure(d.rpm, 60.0, 1e6), figure(d.mib_s, 1.0, 1e6), seed).prop_map(
            |(a, b, rpm, mib_s, seed)| HddParams { seek_min_ms: a.min(b), seek_max_ms: a.max(b), rpm, mib_s, seed },
        )
    }

    fn ssd() -> impl Strategy<Value = SsdParams> {
        let d = SsdParams::default();
        let (read, write) = (figure(d.read_us, 0.0, 1e6), figure(d.write_us, 0.0, 1e6));
        (read, write, prop_oneof![Just(d.channels), 1..64usize], figure(d.mib_s, 1.0, 1e6))
            .prop_map(|(read_us, write_us, channels, mib_s)| SsdParams { read_us, write_us, channels, mib_s })
    }

    fn rule() -> impl Strategy<Value = Rule> {
        let ops =
            proptest::sample::subsequence(vec![Ops::READ, Ops::WRITE, Ops::FLUSH, Ops::DISCARD, Ops::ZERO], 1..=5)
                .prop_map(|v| v.iter().fold(v[0], |a, o| a | *o));
        let effect = prop_oneof![
            Just(Effect::Fail(ErrorKind::Io)),
            Just(Effect::Fail(ErrorKind::NoSpace)),
            (0..10_000_000u64).prop_map(|us| Effect::Delay(Duration::from_micros(us))),
        ];
        let range = proptest::option::of((0..1u64 << 40, 1..1u64 << 30).prop_map(|(a, n)| a..a + n));
        let limit = proptest::option::of(0..1000u64);
        let chance = prop_oneof![Just((1.0, 0)), (0.0..1.0f64, any::<u64>())];
        (ops, effect, range, limit, 0..1000u64, chance).prop_map(|(ops, effect, range, limit, after, (p, seed))| Rule {
            ops,
            effect,
            range,
            limit,
            after,
            probability: p,
            seed,
        })
    }

    fn group() -> impl Strategy<Value = String> {
        "[a-z0-9_.-]{1,12}"
    }

    /// Group options as written (canonical values) and device options.
    fn qos_options() -> impl Strategy<Value = QosOptions> {
        use strata_qos::{DeviceOptions, GroupSettings, Linear};
        let weight = proptest::option::of(1..=10_000u32);
        let cap = || proptest::option::of(proptest::option::of(1..1u64 << 40));
        let model = proptest::option::of(proptest::array::uniform6(1..1u64 << 40));
        let ms = || proptest::option::of(0..=60_000u64);
        (weight, cap(), cap(), cap(), cap(), model, proptest::option::of(1..256usize), ms(), ms(), ms()).prop_map(
            |(weight, riops, wiops, rbps, wbps, model, depth, slice_ms, idle_ms, max_wait_ms)| {
                let mut s = GroupSettings::default();
                let mut given = Vec::new();
                if let Some(w) = weight {
                    s.weight = w;
                    given.push("weight");
                }
                for (key, v) in [("riops", riops), ("wiops", wiops), ("rbps", rbps), ("wbps", wbps)] {
                    if let Some(v) = v {
                        s.set(key, &v.map_or("max".to_string(), |n| n.to_string())).unwrap();
                        given.push(key);
                    }
                }
                let group = given.into_iter().map(|k| (k.to_string(), s.value(k))).collect();
                let model = model.map(|[rbps, rseqiops, rrandiops, wbps, wseqiops, wrandiops]| Linear {
                    rbps,
                    rseqiops,
                    rrandiops,
                    wbps,
                    wseqiops,
                    wrandiops,
                });
                QosOptions { group, device: DeviceOptions { model, depth, slice_ms, idle_ms, max_wait_ms } }
            },
        )
    }

    fn remote() -> impl Strategy<Value = RemoteSpec> {
        let address = prop_oneof![
            ("[a-z][a-z0-9.-]{0,10}", any::<u16>()).prop_map(|(host, port)| Address::Tcp { host, port }),
            (Just("::1".to_string()), any::<u16>()).prop_map(|(host, port)| Address::Tcp { host, port }),
            path().prop_map(Address::Unix),
        ];
        let d = Tuning::default();
        let secs = |d: Duration| prop_oneof![Just(d), (1..100_000u64).prop_map(Duration::from_millis)];
        let tuning = (proptest::option::of(1..16usize), secs(d.timeout), secs(d.outage), size()).prop_map(
            |(connections, timeout, outage, replay_bytes)| Tuning { connections, timeout, outage, replay_bytes },
        );
        let tls = proptest::option::of(
            (proptest::option::of(path()), proptest::option::of("[a-z]{1,6}"), any::<bool>(), any::<bool>()).prop_map(
                |(file, username, x509, verify)| ClientTls {
                    certificates: if x509 { file.clone() } else { None },
                    psk_file: if x509 { None } else { file },
                    username,
                    verify,
                },
            ),
        );
        (address, "([a-z0-9._-]{1,8}(/[a-z0-9]{1,4})?)?", tls, tuning)
            .prop_map(|(address, export, tls, tuning)| RemoteSpec { address, export, tls, tuning })
    }

    fn spec() -> impl Strategy<Value = Spec> {
        let leaf = prop_oneof![
            remote().prop_map(|r| Spec::Nbd(Box::new(r))),
            file().prop_map(Spec::File),
            volume_size().prop_map(|bytes| Spec::Mem { bytes: bytes.min(strata_io::mem::MAX_BYTES) }),
            (file(), hdd()).prop_map(|(file, params)| Spec::Hdd { file, params }),
            (file(), ssd()).prop_map(|(file, params)| Spec::Ssd { file, params }),
            path().prop_map(|path| Spec::Cache { path, origin: None }),
            path().prop_map(|path| Spec::Writecache { path, origin: None }),
            (
                path(),
                0..1u32 << 24,
                proptest::option::of(volume_size()),
                any::<bool>(),
                proptest::option::of(any::<u64>()),
                proptest::option::of(0..=strata_thin::pool::COMMIT_PERIOD_MAX_MS)
            )
                .prop_map(|(pool, id, size, skip_zeroing, low_water, commit_period_ms)| {
                    Spec::Thin { pool, id, size, skip_zeroing, low_water, commit_period_ms, data: None }
                }),
        ];
        leaf.prop_recursive(4, 16, 3, |inner| {
            prop_oneof![
                (proptest::collection::vec(rule(), 1..4), inner.clone())
                    .prop_map(|(rules, inner)| Spec::Fault { rules, inner: Box::new(inner) }),
                (path(), inner.clone()).prop_map(|(path, origin)| Spec::Cache { path, origin: Some(Box::new(origin)) }),
                (path(), inner.clone())
                    .prop_map(|(path, origin)| Spec::Writecache { path, origin: Some(Box::new(origin)) }),
                (path(), 0..1u32 << 24, proptest::option::of(volume_size()), inner.clone()).prop_map(
                    |(pool, id, size, data)| {
                        Spec::Thin {
                            pool,
                            id,
                            size,
                            skip_zeroing: false,
                            low_water: None,
                            commit_period_ms: None,
                            data: Some(Box::new(data)),
                        }
                    }
                ),
                (group(), qos_options(), inner.clone()).prop_map(|(group, options, inner)| Spec::Qos {
                    group,
                    options: Box::new(options),
                    inner: Box::new(inner)
                }),
                (volume_size(), volume_size(), any::<bool>(), inner).prop_map(|(offset, len, overlap, inner)| {
                    Spec::Slice { offset, len, overlap, inner: Box::new(inner) }
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn display_parses_back_to_the_same_spec(s in spec()) {
            let text = s.to_string();
            let back = Spec::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
            prop_assert_eq!(&back, &s, "{}", text);
            prop_assert_eq!(back.to_string(), text);
        }
    }
}

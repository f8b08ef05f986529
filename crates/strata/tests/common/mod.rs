//! Test harness for running `strata serve` as a child process and driving it with real,
//! unmodified NBD clients (qemu-img, qemu-io, nbdinfo, nbdcopy, fio, nbdfuse).
//!
//! * [`Server`] starts the binary under test in its own temp dir, waits until it accepts, and
//!   on drop sends SIGTERM and asserts a clean exit (status 0, "stopped cleanly").
//! * [`run`] / [`output`] run a command with a deadline, reading stdout and stderr concurrently.

#![allow(dead_code)]

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tempfile::TempDir;

pub const MIB: u64 = 1 << 20;
/// How long the server gets to start accepting.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the server gets to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Default deadline for one client command.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(60);

/// A fresh temp dir under cargo's per-target tmp dir (kept short: Unix socket paths are
/// limited to 107 bytes).
pub fn tempdir() -> TempDir {
    tempfile::Builder::new()
        .prefix("s")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("creating a temp dir under CARGO_TARGET_TMPDIR")
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0").local_addr().unwrap().port()
}

/// Whether `prog` is an executable somewhere on PATH (or an existing path).
pub fn have(prog: &str) -> bool {
    if prog.contains('/') {
        return Path::new(prog).exists();
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    // Tools such as losetup and mkfs.ext4 live in sbin, which is not always on a test's PATH.
    let extra: Vec<PathBuf> = ["/usr/local/sbin", "/usr/sbin", "/sbin"].iter().map(PathBuf::from).collect();
    std::env::split_paths(&path).chain(extra).any(|d| d.join(prog).is_file())
}

/// A `Command` for `prog` with sbin directories on PATH.
pub fn cmd(prog: &str) -> Command {
    let mut c = Command::new(prog);
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    for d in ["/usr/local/sbin", "/usr/sbin", "/sbin"] {
        if !dirs.iter().any(|p| p == Path::new(d)) {
            dirs.push(PathBuf::from(d));
        }
    }
    c.env("PATH", std::env::join_paths(dirs).unwrap());
    c
}

fn describe(c: &Command) -> String {
    let mut s = c.get_program().to_string_lossy().into_owned();
    for a in c.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.contains(' ') || a.contains('?') || a.is_empty() {
            s.push_str(&format!("'{a}'"));
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Sends `sig` to a process we started.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall on a pid we own.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert!(
        rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH),
        "kill({pid}, {sig}) failed"
    );
}

/// Polls `child` until it exits or `timeout` passes.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().expect("waiting for a child") {
            return Some(st);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `c` with a deadline; returns its status and output without judging them, or a
/// description of what went wrong (could not start; killed after `timeout`). Never panics, so
/// it is safe in cleanup guards. Stdin is closed.
pub fn try_output(c: &mut Command, timeout: Duration) -> Result<Output, String> {
    let what = describe(c);
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start `{what}`: {e} (is it installed? see scripts/setup.sh)"))?;
    let (tx, rx) = mpsc::channel::<(bool, Vec<u8>)>();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        let _ = tx.send((true, b));
    });
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        let _ = tx2.send((false, b));
    });
    let status = wait_timeout(&mut child, timeout);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    for _ in 0..2 {
        // A grandchild holding a pipe open must not hang us: take what we have.
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok((true, b)) => stdout = b,
            Ok((false, b)) => stderr = b,
            Err(_) => break,
        }
    }
    match status {
        Some(status) => Ok(Output { status, stdout, stderr }),
        None => Err(format!(
            "`{what}` did not finish within {timeout:?}; killed it.\n--- stdout ---\n{}\n--- stderr ---\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )),
    }
}

/// [`try_output`], panicking if the command cannot be started or times out.
pub fn output(c: &mut Command, timeout: Duration) -> Output {
    try_output(c, timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `c` with a deadline and returns its stdout; panics with its stderr unless it exits 0.
pub fn run(c: &mut Command, timeout: Duration) -> String {
    let what = describe(c);
    let o = output(c, timeout);
    if !o.status.success() {
        panic!(
            "`{what}` failed: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// [`run`] with the default deadline.
pub fn run_ok(c: &mut Command) -> String {
    run(c, CMD_TIMEOUT)
}

/// Where the server listens, for the readiness check.
#[derive(Clone, Debug)]
pub enum Listen {
    /// An NBD server on a Unix socket: wait for its greeting.
    Unix(PathBuf),
    /// Any TCP listener (the admin endpoint): wait until it accepts.
    Tcp(String),
    /// An NBD server on TCP: wait for its greeting.
    Nbd(String),
}

/// Reads the whole 18-byte newstyle greeting, so that closing afterwards is a polite
/// disconnect rather than a reset.
fn read_greeting(s: &mut impl Read) -> bool {
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).is_ok() && hello[..8] == *b"NBDMAGIC"
}

/// Whether an NBD server greets on this Unix socket.
pub fn nbd_greets_unix(p: &Path) -> bool {
    match UnixStream::connect(p) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            read_greeting(&mut s)
        }
        Err(_) => false,
    }
}

/// Whether an NBD server greets on this TCP address.
pub fn nbd_greets_tcp(addr: &str) -> bool {
    match TcpStream::connect(addr) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            read_greeting(&mut s)
        }
        Err(_) => false,
    }
}

/// How to start a server: everything after `strata serve`.
pub struct ServerOpts {
    /// Listen on `<dir>/s.sock` (passed as `--unix`).
    pub unix: bool,
    /// Pass `--admin 127.0.0.1:<free port>`.
    pub admin: bool,
    /// Extra arguments (flags, then volumes). `{dir}` is replaced by the temp dir.
    pub args: Vec<String>,
    /// What to wait for when `unix` is false (e.g. the TCP address from a config file).
    pub wait_for: Option<Listen>,
    /// The soft limit on open files to start the server with (the hard one is left).
    pub open_files: Option<u64>,
}

impl Default for ServerOpts {
    fn default() -> Self {
        ServerOpts { unix: true, admin: false, args: Vec::new(), wait_for: None, open_files: None }
    }
}

/// A running `strata serve` child process, stopped (and checked) on drop.
pub struct Server {
    pub dir: TempDir,
    /// The Unix socket, when listening on one.
    pub sock: Option<PathBuf>,
    /// `127.0.0.1:PORT` of the admin endpoint, when started with one.
    pub admin: Option<String>,
    child: Option<Child>,
    stderr_path: PathBuf,
    pub argv: Vec<OsString>,
}

impl Server {
    /// `strata serve --unix <dir>/s.sock VOLUMES...` (`{dir}` in volume specs is replaced).
    pub fn start(volumes: &[&str]) -> Server {
        Server::start_opts(
            tempdir(),
            ServerOpts { args: volumes.iter().map(|s| s.to_string()).collect(), ..Default::default() },
        )
    }

    /// The standard pair: a 64 MiB O_DIRECT file `vol` and 64 MiB of RAM `mem`.
    pub fn start_std() -> Server {
        Server::start(&["vol={dir}/vol.img?size=64MiB", "mem=mem:64MiB"])
    }

    /// Starts a server in `dir` (which it then owns).
    pub fn start_opts(dir: TempDir, opts: ServerOpts) -> Server {
        let d = dir.path().to_path_buf();
        let mut argv: Vec<OsString> = vec!["serve".into()];
        let sock = if opts.unix {
            let s = d.join("s.sock");
            assert!(s.as_os_str().len() < 100, "socket path {} too long for a Unix socket", s.display());
            argv.push("--unix".into());
            argv.push(s.clone().into());
            Some(s)
        } else {
            None
        };
        let admin = if opts.admin {
            let a = format!("127.0.0.1:{}", free_port());
            argv.push("--admin".into());
            argv.push(a.clone().into());
            Some(a)
        } else {
            None
        };
        for a in &opts.args {
            argv.push(a.replace("{dir}", &d.to_string_lossy()).into());
        }
        let stderr_path = d.join("server.stderr");
        let stderr = std::fs::File::create(&stderr_path).unwrap();
        let stdout = stderr.try_clone().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_strata"));
        command.args(&argv).current_dir(&d).stdin(Stdio::null()).stdout(stdout).stderr(stderr);
        if let Some(soft) = opts.open_files {
            use std::os::unix::process::CommandExt;
            // SAFETY: between fork and exec only getrlimit and setrlimit run, both async-signal-safe.
            unsafe {
                command.pre_exec(move || {
                    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
                    if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    lim.rlim_cur = soft.min(lim.rlim_max);
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("starting the strata binary");
        let mut srv = Server { dir, sock: sock.clone(), admin: admin.clone(), child: Some(child), stderr_path, argv };
        let mut waits: Vec<Listen> = Vec::new();
        if let Some(s) = sock {
            waits.push(Listen::Unix(s));
        }
        if let Some(w) = opts.wait_for {
            waits.push(w);
        }
        if let Some(a) = admin {
            waits.push(Listen::Tcp(a));
        }
        assert!(!waits.is_empty(), "nothing to wait for: give unix or wait_for");
        for w in waits {
            srv.wait_listening(&w);
        }
        srv
    }

    fn wait_listening(&mut self, w: &Listen) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let ok = match w {
                Listen::Unix(p) => nbd_greets_unix(p),
                Listen::Tcp(a) => TcpStream::connect(a).is_ok(),
                Listen::Nbd(a) => nbd_greets_tcp(a),
            };
            if ok {
                return;
            }
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "strata serve {:?} exited ({st}) before listening on {w:?}\n--- server stderr ---\n{}",
                    self.argv,
                    self.stderr()
                );
            }
            if Instant::now() >= deadline {
                let mut c = self.child.take().unwrap();
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "strata serve {:?} did not listen on {w:?} within {START_TIMEOUT:?}\n--- server stderr ---\n{}",
                    self.argv,
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server already stopped").id()
    }

    /// Everything the server wrote to stdout/stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// `nbd+unix:///EXPORT?socket=...`
    pub fn uri(&self, export: &str) -> String {
        let s = self.sock.as_ref().expect("server has no Unix socket");
        format!("nbd+unix:///{export}?socket={}", s.display())
    }

    /// `GET path` on the admin endpoint; returns the body of a 200 reply.
    pub fn admin_get(&self, path: &str) -> String {
        let addr = self.admin.as_ref().expect("server started without --admin");
        http_get(addr, path)
    }

    /// The admin /status document.
    pub fn status(&self) -> serde_json::Value {
        serde_json::from_str(&self.admin_get("/status")).expect("admin /status is JSON")
    }

    /// `ops.<op>.<field>` of volume `vol` in /status.
    pub fn op_counter(&self, vol: &str, op: &str, field: &str) -> u64 {
        let st = self.status();
        let v = st["volumes"]
            .as_array()
            .expect("volumes array")
            .iter()
            .find(|v| v["name"] == vol)
            .unwrap_or_else(|| panic!("volume {vol} not in /status: {st}"));
        v["ops"][op][field].as_u64().unwrap_or_else(|| panic!("ops.{op}.{field} missing for {vol}: {v}"))
    }

    /// Sends SIGTERM and waits for the exit; returns the status and the server's output.
    /// Panics (after SIGKILL) if it does not exit within [`STOP_TIMEOUT`].
    pub fn terminate(&mut self) -> (ExitStatus, String) {
        let mut c = self.child.take().expect("server already stopped");
        signal(c.id(), libc::SIGTERM);
        match wait_timeout(&mut c, STOP_TIMEOUT) {
            Some(st) => (st, self.stderr()),
            None => {
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "strata serve did not exit within {STOP_TIMEOUT:?} of SIGTERM\n--- server stderr ---\n{}",
                    self.stderr()
                );
            }
        }
    }

    /// SIGTERM, then assert exit 0 and "stopped cleanly".
    pub fn stop(mut self) -> String {
        self.stop_checked()
    }

    /// SIGTERM, then assert exit 0, "stopped cleanly" and that the socket is gone; the temp
    /// dir stays until the `Server` is dropped.
    pub fn stop_checked(&mut self) -> String {
        let (st, err) = self.terminate();
        assert!(st.success(), "strata serve exited with {st} after SIGTERM\n--- server stderr ---\n{err}");
        assert!(err.contains("stopped cleanly"), "no \"stopped cleanly\" after SIGTERM\n--- server stderr ---\n{err}");
        if let Some(s) = &self.sock {
            assert!(!s.exists(), "the Unix socket {} was left behind", s.display());
        }
        err
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if std::thread::panicking() {
            // Don't turn one failure into an abort; just make sure the process goes away.
            if let Some(mut c) = self.child.take() {
                signal(c.id(), libc::SIGTERM);
                if wait_timeout(&mut c, STOP_TIMEOUT).is_none() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                eprintln!("--- server stderr (test failed) ---\n{}", self.stderr());
            }
            return;
        }
        self.stop_checked();
    }
}

/// A minimal HTTP/1.1 GET; returns the body, panics unless the status is 200.
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or_else(|| panic!("malformed HTTP reply: {resp:?}"));
    assert!(head.starts_with("HTTP/1.1 200"), "GET {path}: {head}");
    body.to_string()
}

/// `n` bytes of seeded pseudo-random data.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; n];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Panics with the first differing offset if `a != b`.
pub fn assert_same_bytes(a: &[u8], b: &[u8], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
        panic!("{what}: first difference at byte {i} ({:#04x} vs {:#04x})", a[i], b[i]);
    }
}

/// The JSON document in a tool's stdout, skipping chatter before it (fio prints
/// "fio: connected to NBD server" first).
pub fn json_in(stdout: &str) -> serde_json::Value {
    let mut start = None;
    let mut pos = 0;
    for line in stdout.split_inclusive('\n') {
        if line.starts_with('{') || line.starts_with('[') {
            start = Some(pos);
            break;
        }
        pos += line.len();
    }
    let start = start.unwrap_or_else(|| panic!("no JSON in output:\n{stdout}"));
    serde_json::from_str(&stdout[start..]).unwrap_or_else(|e| panic!("bad JSON ({e}) in output:\n{stdout}"))
}

//! Protocol tests: a raw client speaks the wire format to the server over in-process socket
//! pairs, option by option and command by command, including every error path.

use std::sync::Arc;
use std::time::Duration;
use strata_io::mem::MemDev;
use strata_io::{BlockDev, BoxFut, Buf, Extent, Result as IoResult, ZeroFlags};
use strata_nbd::proto::*;
use strata_nbd::{Export, Limits, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const SIZE: u64 = 8 << 20;

/// A RAM device whose reads at offset 0 are slow, to show replies leave out of order.
struct SlowAtZero(MemDev);

impl BlockDev for SlowAtZero {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn describe(&self) -> String {
        "slow-at-zero".into()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, IoResult<Buf>> {
        Box::pin(async move {
            if offset == 0 {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            self.0.read(offset, buf).await
        })
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, IoResult<Buf>> {
        self.0.write(offset, buf, fua)
    }
    fn flush(&self) -> BoxFut<'_, IoResult<()>> {
        self.0.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, IoResult<()>> {
        self.0.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, IoResult<()>> {
        self.0.write_zeroes(offset, len, flags)
    }
    fn block_status(&self, offset: u64, len: u64) -> BoxFut<'_, IoResult<Vec<Extent>>> {
        self.0.block_status(offset, len)
    }
}

fn server_with(limits: Limits) -> Server {
    let exports = vec![
        Export { name: "mem".into(), description: "test".into(), dev: Arc::new(MemDev::new(SIZE)), read_only: false },
        Export { name: "ro".into(), description: String::new(), dev: Arc::new(MemDev::new(SIZE)), read_only: true },
        Export {
            name: "slow".into(),
            description: String::new(),
            dev: Arc::new(SlowAtZero(MemDev::new(SIZE))),
            read_only: false,
        },
    ];
    Server::new(exports, limits).unwrap()
}

fn server() -> Server {
    server_with(Limits::default())
}

struct Client {
    s: UnixStream,
}

struct OptReply {
    opt: u32,
    kind: u32,
    data: Vec<u8>,
}

impl Client {
    /// Connects and reads the greeting; `flags` are the client flags to send.
    async fn connect(server: &Server, flags: u32) -> Client {
        let (a, b) = UnixStream::pair().unwrap();
        server.spawn_connection(b);
        let mut c = Client { s: a };
        assert_eq!(c.s.read_u64().await.unwrap(), NBDMAGIC);
        assert_eq!(c.s.read_u64().await.unwrap(), IHAVEOPT);
        let hs = c.s.read_u16().await.unwrap();
        assert_eq!(hs, FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
        c.s.write_u32(flags).await.unwrap();
        c
    }

    async fn new(server: &Server) -> Client {
        Client::connect(server, CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).await
    }

    async fn send_opt(&mut self, opt: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.s.write_all(&b).await.unwrap();
    }

    async fn opt_reply(&mut self) -> OptReply {
        assert_eq!(self.s.read_u64().await.unwrap(), OPT_REPLY_MAGIC);
        let opt = self.s.read_u32().await.unwrap();
        let kind = self.s.read_u32().await.unwrap();
        let len = self.s.read_u32().await.unwrap();
        let mut data = vec![0; len as usize];
        self.s.read_exact(&mut data).await.unwrap();
        OptReply { opt, kind, data }
    }

    /// Replies up to and including the final one (ACK or an error).
    async fn opt_replies(&mut self) -> Vec<OptReply> {
        let mut v = Vec::new();
        loop {
            let r = self.opt_reply().await;
            let last = r.kind == REP_ACK || r.kind & (1 << 31) != 0;
            v.push(r);
            if last {
                return v;
            }
        }
    }

    async fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(tokio::time::timeout(Duration::from_secs(5), self.s.read(&mut b)).await, Ok(Ok(0)) | Ok(Err(_)))
    }

    async fn structured(&mut self) {
        self.send_opt(OPT_STRUCTURED_REPLY, &[]).await;
        assert_eq!(self.opt_replies().await[0].kind, REP_ACK);
    }

    async fn set_meta(&mut self, export: &str, queries: &[&str]) -> Vec<OptReply> {
        self.send_opt(OPT_SET_META_CONTEXT, &meta_data(export, queries)).await;
        self.opt_replies().await
    }

    /// OPT_GO; returns the transmission flags.
    async fn go(&mut self, export: &str, reqs: &[u16]) -> u16 {
        self.send_opt(OPT_GO, &go_data(export, reqs)).await;
        let replies = self.opt_replies().await;
        assert_eq!(replies.last().unwrap().kind, REP_ACK, "GO failed: {:?}", replies.last().unwrap().kind);
        let info = replies.iter().find(|r| r.kind == REP_INFO && r.data[..2] == INFO_EXPORT.to_be_bytes()).unwrap();
        u16::from_be_bytes(info.data[10..12].try_into().unwrap())
    }

    async fn request(&mut self, kind: u16, flags: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) {
        let req = Request { flags, kind, cookie, offset, length };
        let mut b = req.encode().to_vec();
        b.extend_from_slice(payload);
        self.s.write_all(&b).await.unwrap();
    }

    /// A simple reply: (error, cookie).
    async fn simple(&mut self) -> (u32, u64) {
        assert_eq!(self.s.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
        (self.s.read_u32().await.unwrap(), self.s.read_u64().await.unwrap())
    }

    /// Any reply in structured mode: (magic, flags, type, cookie, payload). Simple replies
    /// come back as type u16::MAX with the error number as payload.
    async fn any_reply(&mut self) -> (u16, u16, u64, Vec<u8>) {
        let magic = self.s.read_u32().await.unwrap();
        if magic == SIMPLE_REPLY_MAGIC {
            let err = self.s.read_u32().await.unwrap();
            let cookie = self.s.read_u64().await.unwrap();
            return (REPLY_FLAG_DONE, u16::MAX, cookie, err.to_be_bytes().to_vec());
        }
        assert_eq!(magic, STRUCTURED_REPLY_MAGIC);
        let flags = self.s.read_u16().await.unwrap();
        let kind = self.s.read_u16().await.unwrap();
        let cookie = self.s.read_u64().await.unwrap();
        let len = self.s.read_u32().await.unwrap();
        let mut data = vec![0; len as usize];
        self.s.read_exact(&mut data).await.unwrap();
        (flags, kind, cookie, data)
    }
}

fn go_data(export: &str, reqs: &[u16]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(reqs.len() as u16).to_be_bytes());
    for r in reqs {
        d.extend_from_slice(&r.to_be_bytes());
    }
    d
}

fn meta_data(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (export.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(export.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

#[tokio::test]
async fn unknown_client_flags_drop_the_connection() {
    let s = server();
    let mut c = Client::connect(&s, 1 << 7).await;
    assert!(c.is_closed().await);
}

#[tokio::test]
async fn list_names_every_export_and_refuses_data() {
    let s = server();
    let mut c = Client::new(&s).await;
    c.send_opt(OPT_LIST, &[]).await;
    let r = c.opt_replies().await;
    let names: Vec<String> = r
        .iter()
        .filter(|r| r.kind == REP_SERVER)
        .map(|r| {
            let n = u32::from_be_bytes(r.data[..4].try_into().unwrap()) as usize;
            String::from_utf8(r.data[4..4 + n].to_vec()).unwrap()
        })
        .collect();
    assert_eq!(names, ["mem", "ro", "slow"]);
    assert_eq!(r.last().unwrap().kind, REP_ACK);
    assert!(r.iter().all(|r| r.opt == OPT_LIST));
    c.send_opt(OPT_LIST, b"junk").await;
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_INVALID);
}

#[tokio::test]
async fn info_reports_size_flags_block_sizes_and_name() {
    let s = server();
    let mut c = Client::new(&s).await;
    c.send_opt(OPT_INFO, &go_data("mem", &[INFO_NAME, INFO_DESCRIPTION])).await;
    let r = c.opt_replies().await;
    let export = r.iter().find(|r| r.kind == REP_INFO && r.data[..2] == [0, 0]).unwrap();
    assert_eq!(u64::from_be_bytes(export.data[2..10].try_into().unwrap()), SIZE);
    let flags = u16::from_be_bytes(export.data[10..12].try_into().unwrap());
    for f in [
        TFLAG_HAS_FLAGS,
        TFLAG_SEND_FLUSH,
        TFLAG_SEND_FUA,
        TFLAG_SEND_TRIM,
        TFLAG_SEND_WRITE_ZEROES,
        TFLAG_CAN_MULTI_CONN,
        TFLAG_SEND_CACHE,
        TFLAG_SEND_FAST_ZERO,
    ] {
        assert_ne!(flags & f, 0, "flag {f:#x} missing from {flags:#x}");
    }
    assert_eq!(flags & TFLAG_READ_ONLY, 0);
    assert_eq!(flags & TFLAG_SEND_DF, 0, "DF only with structured replies");
    let bs = r.iter().find(|r| r.kind == REP_INFO && r.data[..2] == INFO_BLOCK_SIZE.to_be_bytes()).unwrap();
    let v: Vec<u32> = bs.data[2..].chunks(4).map(|c| u32::from_be_bytes(c.try_into().unwrap())).collect();
    assert!(v[0].is_power_of_two() && v[0] <= v[1] && v[1] <= v[2] && v[2] >= 1 << 20, "{v:?}");
    let name = r.iter().find(|r| r.kind == REP_INFO && r.data[..2] == INFO_NAME.to_be_bytes()).unwrap();
    assert_eq!(&name.data[2..], b"mem");
    // INFO leaves the client in negotiation: an unknown export is an error, not a hang-up.
    c.send_opt(OPT_INFO, &go_data("nope", &[])).await;
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_UNKNOWN);
    c.send_opt(OPT_GO, &go_data("nope", &[])).await;
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_UNKNOWN);
    // Read-only export says so, and offers nothing that changes data.
    let f = c.go("ro", &[]).await;
    assert_ne!(f & TFLAG_READ_ONLY, 0);
    assert_eq!(f & (TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO), 0, "{f:#x}");
}

#[tokio::test]
async fn unknown_malformed_and_oversized_options_keep_framing() {
    let s = server();
    let mut c = Client::new(&s).await;
    c.send_opt(999, b"whatever").await;
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_UNSUP);
    c.send_opt(11, &[]).await; // EXTENDED_HEADERS: not offered
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_UNSUP);
    c.send_opt(OPT_STARTTLS, &[]).await;
    assert!(c.opt_replies().await[0].kind & (1 << 31) != 0);
    let mut bad = go_data("mem", &[]);
    bad.push(0); // trailing byte
    c.send_opt(OPT_GO, &bad).await;
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_INVALID);
    c.send_opt(OPT_GO, &[0, 0, 0, 9, b'm']).await; // name longer than the data
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_INVALID);
    c.send_opt(OPT_STRUCTURED_REPLY, b"x").await;
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_INVALID);
    c.send_opt(77, &vec![0u8; 100 << 10]).await;
    assert_eq!(c.opt_replies().await[0].kind, REP_ERR_TOO_BIG);
    // After all that, the connection still works.
    c.go("mem", &[]).await;
    c.request(CMD_FLUSH, 0, 1, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (0, 1));
}

#[tokio::test]
async fn hostile_handshakes_close_only_their_connection() {
    let s = server();
    let mut good = Client::new(&s).await;
    let mut c = Client::new(&s).await;
    c.s.write_all(&[0xde; 16]).await.unwrap(); // bad option magic
    assert!(c.is_closed().await);
    let mut c = Client::new(&s).await;
    let mut b = IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&u32::MAX.to_be_bytes()); // absurd length
    c.s.write_all(&b).await.unwrap();
    assert!(c.is_closed().await);
    let mut c = Client::new(&s).await;
    c.send_opt(OPT_EXPORT_NAME, b"nope").await; // EXPORT_NAME can only hang up
    assert!(c.is_closed().await);
    let mut c = Client::new(&s).await;
    c.send_opt(OPT_ABORT, &[]).await;
    assert_eq!(c.opt_replies().await[0].kind, REP_ACK);
    assert!(c.is_closed().await);
    good.go("mem", &[]).await;
    good.request(CMD_FLUSH, 0, 5, 0, 0, &[]).await;
    assert_eq!(good.simple().await, (0, 5));
}

#[tokio::test]
async fn export_name_fallback_with_and_without_zeroes() {
    let s = server();
    for no_zeroes in [true, false] {
        let flags = CLIENT_FIXED_NEWSTYLE | if no_zeroes { CLIENT_NO_ZEROES } else { 0 };
        let mut c = Client::connect(&s, flags).await;
        c.send_opt(OPT_EXPORT_NAME, b"").await; // default export
        assert_eq!(c.s.read_u64().await.unwrap(), SIZE);
        let f = c.s.read_u16().await.unwrap();
        assert_ne!(f & TFLAG_HAS_FLAGS, 0);
        if !no_zeroes {
            let mut z = [1u8; 124];
            c.s.read_exact(&mut z).await.unwrap();
            assert!(z.iter().all(|&b| b == 0));
        }
        // Simple replies, as the kernel expects.
        c.request(CMD_WRITE, 0, 7, 4096, 4, b"abcd").await;
        assert_eq!(c.simple().await, (0, 7));
        c.request(CMD_READ, 0, 8, 4096, 4, &[]).await;
        assert_eq!(c.simple().await, (0, 8));
        let mut d = [0u8; 4];
        c.s.read_exact(&mut d).await.unwrap();
        assert_eq!(&d, b"abcd");
        c.request(CMD_DISC, 0, 9, 0, 0, &[]).await;
        assert!(c.is_closed().await);
    }
}

#[tokio::test]
async fn simple_replies_for_every_command_and_error() {
    let s = server();
    let mut c = Client::new(&s).await;
    c.go("mem", &[]).await;
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    c.request(CMD_WRITE, CMD_FLAG_FUA, 1, 8192, 8192, &data).await;
    assert_eq!(c.simple().await, (0, 1));
    c.request(CMD_READ, 0, 2, 8192, 8192, &[]).await;
    assert_eq!(c.simple().await, (0, 2));
    let mut got = vec![0u8; 8192];
    c.s.read_exact(&mut got).await.unwrap();
    assert_eq!(got, data);
    c.request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 3, 8192, 4096, &[]).await;
    assert_eq!(c.simple().await, (0, 3));
    c.request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA, 4, 12288, 4096, &[]).await;
    assert_eq!(c.simple().await, (0, 4));
    c.request(CMD_READ, 0, 5, 8192, 8192, &[]).await;
    assert_eq!(c.simple().await, (0, 5));
    c.s.read_exact(&mut got).await.unwrap();
    assert!(got.iter().all(|&b| b == 0));
    c.request(CMD_TRIM, CMD_FLAG_FUA, 6, 0, 65536, &[]).await;
    assert_eq!(c.simple().await, (0, 6));
    c.request(CMD_CACHE, 0, 7, 0, 65536, &[]).await;
    assert_eq!(c.simple().await, (0, 7));
    c.request(CMD_FLUSH, 0, 8, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (0, 8));
    // FUA is valid on every command (the protocol: clients set it on flushes and reads).
    c.request(CMD_FLUSH, CMD_FLAG_FUA, 81, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (0, 81), "flush with FUA");
    c.request(CMD_CACHE, CMD_FLAG_FUA, 82, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (0, 82), "cache with FUA");
    c.request(CMD_READ, CMD_FLAG_FUA, 83, 8192, 8192, &[]).await;
    assert_eq!(c.simple().await, (0, 83), "read with FUA");
    c.s.read_exact(&mut got).await.unwrap();

    // Errors, each followed by proof that framing survived.
    c.request(CMD_READ, 0, 10, SIZE - 512, 1024, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 10), "read past the end");
    c.request(CMD_WRITE, 0, 11, SIZE - 2, 4, b"wxyz").await;
    assert_eq!(c.simple().await, (ENOSPC, 11), "write past the end");
    c.request(CMD_WRITE_ZEROES, 0, 12, SIZE, 512, &[]).await;
    assert_eq!(c.simple().await, (ENOSPC, 12), "zeroes past the end");
    c.request(CMD_TRIM, 0, 13, u64::MAX - 10, 512, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 13), "trim with overflowing offset");
    c.request(42, 0, 14, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 14), "unknown command");
    c.request(CMD_READ, 1 << 9, 15, 0, 512, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 15), "unknown flag");
    c.request(CMD_READ, CMD_FLAG_DF, 16, 0, 512, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 16), "DF without structured replies");
    c.request(CMD_WRITE, CMD_FLAG_REQ_ONE, 17, 0, 3, b"abc").await;
    assert_eq!(c.simple().await, (EINVAL, 17), "flag of another command, payload still consumed");
    c.request(CMD_READ, 0, 18, 0, 0, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 18), "zero-length read");
    c.request(CMD_READ, 0, 19, 0, 64 << 20, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 19), "read larger than the maximum");
    c.request(CMD_BLOCK_STATUS, 0, 20, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (EINVAL, 20), "block status without a context");
    c.request(CMD_WRITE, 0, 21, 0, 40 << 20, &vec![0u8; 40 << 20]).await;
    assert_eq!(c.simple().await, (EINVAL, 21), "write larger than the maximum is drained and refused");
    c.request(CMD_READ, 0, 22, 8192 + 1, 3, &[]).await; // unaligned but allowed: no block size agreed
    assert_eq!(c.simple().await, (0, 22));
    let mut three = [0u8; 3];
    c.s.read_exact(&mut three).await.unwrap();
}

#[tokio::test]
async fn agreed_block_sizes_are_enforced() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = strata_io::file::FileOptions { create_size: Some(1 << 20), ..Default::default() };
    let dev: Arc<dyn BlockDev> = Arc::new(strata_io::file::FileDev::open(&dir.path().join("f"), &opts).unwrap());
    let min = dev.geometry().min_block_bytes;
    let s = Server::new(
        vec![Export { name: "f".into(), description: String::new(), dev, read_only: false }],
        Limits::default(),
    )
    .unwrap();
    let mut c = Client::new(&s).await;
    c.go("f", &[INFO_BLOCK_SIZE]).await;
    if min > 1 {
        c.request(CMD_READ, 0, 1, 1, 512, &[]).await;
        assert_eq!(c.simple().await, (EINVAL, 1), "misaligned after agreeing block sizes");
        c.request(CMD_WRITE, 0, 2, 0, 100, &[0u8; 100]).await;
        assert_eq!(c.simple().await, (EINVAL, 2));
    }
    c.request(CMD_READ, 0, 3, 4096, 4096, &[]).await;
    assert_eq!(c.simple().await, (0, 3));
}

#[tokio::test]
async fn read_only_export_refuses_writes_with_eperm() {
    let s = server();
    let mut c = Client::new(&s).await;
    c.go("ro", &[]).await;
    c.request(CMD_WRITE, 0, 1, 0, 4, b"abcd").await;
    assert_eq!(c.simple().await, (EPERM, 1));
    c.request(CMD_TRIM, 0, 2, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (EPERM, 2));
    c.request(CMD_WRITE_ZEROES, 0, 3, 0, 4096, &[]).await;
    assert_eq!(c.simple().await, (EPERM, 3));
    c.request(CMD_READ, 0, 4, 0, 4, &[]).await;
    assert_eq!(c.simple().await, (0, 4));
}

#[tokio::test]
async fn structured_replies_and_block_status() {
    let s = server();
    let mut c = Client::new(&s).await;
    // SET_META_CONTEXT needs structured replies first.
    assert_eq!(c.set_meta("mem", &[BASE_ALLOCATION]).await[0].kind, REP_ERR_INVALID);
    c.structured().await;
    c.send_opt(OPT_LIST_META_CONTEXT, &meta_data("mem", &[])).await;
    let r = c.opt_replies().await;
    assert_eq!(r[0].kind, REP_META_CONTEXT);
    assert_eq!(&r[0].data[4..], BASE_ALLOCATION.as_bytes());
    let r = c.set_meta("mem", &["qemu:dirty-bitmap:x", BASE_ALLOCATION]).await;
    assert_eq!(r.len(), 2, "one context, then ACK");
    let id = u32::from_be_bytes(r[0].data[..4].try_into().unwrap());
    let flags = c.go("mem", &[]).await;
    assert_ne!(flags & TFLAG_SEND_DF, 0);

    // In the middle, away from both ends (the RAM device allocates 2 MiB at a time).
    c.request(CMD_WRITE, 0, 1, SIZE / 2, 65536, &vec![9u8; 65536]).await;
    assert_eq!(c.any_reply().await.1, u16::MAX, "writes may use simple replies");
    c.request(CMD_READ, CMD_FLAG_DF, 2, SIZE / 2, 4096, &[]).await;
    let (f, kind, cookie, data) = c.any_reply().await;
    assert_eq!((f & REPLY_FLAG_DONE, kind, cookie), (REPLY_FLAG_DONE, CHUNK_OFFSET_DATA, 2));
    assert_eq!(u64::from_be_bytes(data[..8].try_into().unwrap()), SIZE / 2);
    assert!(data[8..].iter().all(|&b| b == 9) && data.len() == 8 + 4096);

    // Read errors are structured error chunks.
    c.request(CMD_READ, 0, 3, SIZE, 512, &[]).await;
    let (f, kind, cookie, data) = c.any_reply().await;
    assert_eq!((f & REPLY_FLAG_DONE, kind, cookie), (REPLY_FLAG_DONE, CHUNK_ERROR, 3));
    assert_eq!(u32::from_be_bytes(data[..4].try_into().unwrap()), EINVAL);
    let msg_len = u16::from_be_bytes(data[4..6].try_into().unwrap()) as usize;
    assert_eq!(data.len(), 6 + msg_len);

    // Block status over the whole device: hole, data, hole.
    c.request(CMD_BLOCK_STATUS, 0, 4, 0, SIZE as u32, &[]).await;
    let (_, kind, _, data) = c.any_reply().await;
    assert_eq!(kind, CHUNK_BLOCK_STATUS);
    assert_eq!(u32::from_be_bytes(data[..4].try_into().unwrap()), id);
    let descs: Vec<(u32, u32)> = data[4..]
        .chunks(8)
        .map(|d| (u32::from_be_bytes(d[..4].try_into().unwrap()), u32::from_be_bytes(d[4..].try_into().unwrap())))
        .collect();
    assert_eq!(descs.iter().map(|d| d.0 as u64).sum::<u64>(), SIZE);
    assert!(descs.iter().any(|d| d.1 == 0), "some data: {descs:?}");
    assert_eq!(descs[0].1, STATE_HOLE | STATE_ZERO);
    // REQ_ONE: exactly one descriptor, no longer than asked (FUA, valid on every command,
    // changes nothing).
    c.request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE | CMD_FLAG_FUA, 5, 0, 8192, &[]).await;
    let (_, _, _, data) = c.any_reply().await;
    assert_eq!(data.len(), 12);
    assert!(u32::from_be_bytes(data[4..8].try_into().unwrap()) <= 8192);
    c.request(CMD_BLOCK_STATUS, 0, 6, SIZE - 512, 1024, &[]).await;
    let (_, kind, _, _) = c.any_reply().await;
    assert_eq!(kind, CHUNK_ERROR, "block status past the end");
}

/// SET_META_CONTEXT replaces what was set before even when it fails; an error that quotes
/// a client's long name stays within the protocol's 4096 bytes.
#[tokio::test]
async fn a_failed_set_meta_context_clears_the_selection() {
    let s = server();
    let mut c = Client::new(&s).await;
    c.structured().await;
    assert_eq!(c.set_meta("mem", &[BASE_ALLOCATION]).await.len(), 2, "one context, then ACK");
    let long = "x".repeat(5000);
    let r = c.set_meta(&long, &[BASE_ALLOCATION]).await;
    assert_eq!(r[0].kind, REP_ERR_UNKNOWN);
    assert!(r[0].data.len() <= 4096, "an error of {} bytes", r[0].data.len());
    c.go("mem", &[]).await;
    c.request(CMD_BLOCK_STATUS, 0, 1, 0, 4096, &[]).await;
    let (_, kind, _, data) = c.any_reply().await;
    assert_eq!(kind, CHUNK_ERROR, "block status after the failed SET_META_CONTEXT");
    assert_eq!(u32::from_be_bytes(data[..4].try_into().unwrap()), EINVAL);
}

#[tokio::test]
async fn replies_leave_in_completion_order() {
    let s = server();
    let mut c = Client::new(&s).await;
    c.go("slow", &[]).await;
    c.request(CMD_READ, 0, 1, 0, 512, &[]).await; // slow
    c.request(CMD_READ, 0, 2, 4096, 512, &[]).await; // fast
    let first = c.simple().await;
    assert_eq!(first, (0, 2), "the fast read overtakes the slow one");
    let mut d = [0u8; 512];
    c.s.read_exact(&mut d).await.unwrap();
    assert_eq!(c.simple().await, (0, 1));
}

#[tokio::test]
async fn bad_request_magic_and_vanishing_clients_hurt_no_one_else() {
    let s = server();
    let mut good = Client::new(&s).await;
    good.go("mem", &[]).await;
    let mut bad = Client::new(&s).await;
    bad.go("mem", &[]).await;
    bad.s.write_all(&[0x55; 28]).await.unwrap();
    assert!(bad.is_closed().await);
    // A client that dies halfway through a write payload.
    let mut gone = Client::new(&s).await;
    gone.go("mem", &[]).await;
    gone.request(CMD_WRITE, 0, 1, 0, 65536, &[1u8; 1000]).await;
    drop(gone);
    // A write payload larger than anything drainable closes the connection.
    let mut huge = Client::new(&s).await;
    huge.go("mem", &[]).await;
    huge.request(CMD_WRITE, 0, 1, 0, u32::MAX, &[]).await;
    assert!(huge.is_closed().await);
    good.request(CMD_WRITE, 0, 3, 0, 4, b"ok!!").await;
    assert_eq!(good.simple().await, (0, 3));
    until_live(&s, 1).await;
}

/// Waits (10 s at most) until `s` serves `n` connections: a closed one is counted out once
/// its task has ended.
async fn until_live(s: &Server, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while s.live_connections() != n && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.live_connections(), n);
}

#[tokio::test]
async fn connection_limit_closes_extra_connections() {
    let s = server_with(Limits { max_connections: 2, ..Limits::default() });
    let _a = Client::new(&s).await;
    let _b = Client::new(&s).await;
    let (x, y) = UnixStream::pair().unwrap();
    s.spawn_connection(y);
    let mut x = x;
    let mut b = [0u8; 8];
    assert!(matches!(x.read(&mut b).await, Ok(0) | Err(_)), "third connection refused");
}

#[tokio::test]
async fn many_connections_opened_and_dropped() {
    let s = server();
    for i in 0..2000 {
        let (a, b) = UnixStream::pair().unwrap();
        s.spawn_connection(b);
        if i % 2 == 0 {
            drop(a); // before the greeting is even read
        } else {
            let mut a = a;
            let _ = a.write_all(&[0, 0, 0, 3, 1, 2]).await;
        }
    }
    until_live(&s, 0).await;
    let mut c = Client::new(&s).await;
    c.go("mem", &[]).await;
}

#[tokio::test]
async fn inflight_requests_per_connection_are_bounded() {
    // A client that never reads replies: the server stops taking requests from it once the
    // limit is reached, instead of queueing without bound.
    let s = server_with(Limits { max_inflight_per_connection: 4, ..Limits::default() });
    let mut c = Client::new(&s).await;
    c.go("mem", &[]).await;
    let (mut rd, mut wr) = c.s.into_split();
    let sent = tokio::spawn(async move {
        let mut n = 0u64;
        let req = Request { flags: 0, kind: CMD_READ, cookie: 0, offset: 0, length: 1 << 20 };
        while wr.write_all(&req.encode()).await.is_ok() {
            n += 1;
            if n > 100_000 {
                break;
            }
        }
        n
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!sent.is_finished(), "the server kept reading requests it could not answer");
    // Drain one reply to show the connection is alive, then hang up.
    assert_eq!(rd.read_u32().await.unwrap(), SIMPLE_REPLY_MAGIC);
    drop(rd);
    sent.abort();
}

#[tokio::test]
async fn shutdown_finishes_inflight_requests() {
    let s = server();
    let mut c = Client::new(&s).await;
    c.go("slow", &[]).await;
    c.request(CMD_READ, 0, 1, 0, 512, &[]).await; // takes 300 ms
    tokio::time::sleep(Duration::from_millis(50)).await;
    s.shutdown();
    assert_eq!(c.simple().await, (0, 1), "the in-flight read completes");
    let mut d = [0u8; 512];
    c.s.read_exact(&mut d).await.unwrap();
    assert!(c.is_closed().await);
    tokio::time::timeout(Duration::from_secs(5), s.wait_idle()).await.unwrap();
    // New clients are refused once shutdown began.
    let mut late = Client::new(&s).await;
    late.send_opt(OPT_GO, &go_data("mem", &[])).await;
    assert_eq!(late.opt_replies().await[0].kind, REP_ERR_SHUTDOWN);
}

/// Payload buffers are reused per connection without being zeroed: after reads and writes
/// that failed in the device, refused requests and a client that vanished mid-payload, every
/// reply still carries exactly its own bytes.
#[tokio::test]
async fn reused_buffers_never_carry_one_requests_bytes_into_another_reply() {
    use strata_io::fault::{FaultDev, Rule};
    let (dev, faults) = FaultDev::new(MemDev::new(SIZE));
    faults.add(Rule::read_error(1 << 20..(1 << 20) + 4096));
    faults.add(Rule::write_error(2 << 20..(2 << 20) + 4096));
    let export = Export { name: "f".into(), description: String::new(), dev: Arc::new(dev), read_only: false };
    let s = Server::new(vec![export], Limits::default()).unwrap();
    let secret = vec![0x5Au8; 64 << 10];
    let mut got = vec![0u8; 64 << 10];
    let mut c = Client::new(&s).await;
    c.go("f", &[]).await;
    c.request(CMD_WRITE, 0, 1, 0, 64 << 10, &secret).await;
    assert_eq!(c.simple().await, (0, 1));
    for round in 0..3u64 {
        let cookie = 10 * (round + 1);
        c.request(CMD_READ, 0, cookie, 0, 64 << 10, &[]).await;
        assert_eq!(c.simple().await, (0, cookie));
        c.s.read_exact(&mut got).await.unwrap();
        assert_eq!(got, secret);
        c.request(CMD_READ, 0, cookie + 1, 1 << 20, 64 << 10, &[]).await;
        assert_eq!(c.simple().await, (EIO, cookie + 1), "a failed read has no payload");
        c.request(CMD_WRITE, 0, cookie + 2, 2 << 20, 64 << 10, &secret).await;
        assert_eq!(c.simple().await, (EIO, cookie + 2));
        c.request(CMD_WRITE, 1 << 9, cookie + 3, 3 << 20, 64 << 10, &secret).await;
        assert_eq!(c.simple().await, (EINVAL, cookie + 3), "a refused write");
        for (i, at) in [3u64 << 20, 2 << 20, (1 << 20) + 65536].into_iter().enumerate() {
            c.request(CMD_READ, 0, cookie + 4 + i as u64, at, 64 << 10, &[]).await;
            assert_eq!(c.simple().await, (0, cookie + 4 + i as u64));
            c.s.read_exact(&mut got).await.unwrap();
            assert!(got.iter().all(|&b| b == 0), "round {round}: stale bytes in the read at {at}");
        }
    }
    // A write cut short by a vanishing client writes nothing.
    let mut cut = Client::new(&s).await;
    cut.go("f", &[]).await;
    cut.request(CMD_WRITE, 0, 1, 4 << 20, 64 << 10, &secret[..30000]).await;
    drop(cut);
    c.request(CMD_READ, 0, 99, 4 << 20, 64 << 10, &[]).await;
    assert_eq!(c.simple().await, (0, 99));
    c.s.read_exact(&mut got).await.unwrap();
    assert!(got.iter().all(|&b| b == 0));
}

/// A device whose connection handles take a moment to let go of it (as a file's lock is
/// released when its last handle closes), and say when they have.
struct Handle {
    mem: Arc<MemDev>,
    released: Arc<std::sync::atomic::AtomicBool>,
    /// A connection's handle (made by `connect`), not the export's device.
    connection: bool,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.connection {
            std::thread::sleep(Duration::from_millis(50));
            self.released.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl BlockDev for Handle {
    fn size(&self) -> u64 {
        self.mem.size()
    }
    fn describe(&self) -> String {
        "handle".into()
    }
    fn read(&self, offset: u64, buf: Buf) -> BoxFut<'_, IoResult<Buf>> {
        self.mem.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: Buf, fua: bool) -> BoxFut<'_, IoResult<Buf>> {
        self.mem.write(offset, buf, fua)
    }
    fn flush(&self) -> BoxFut<'_, IoResult<()>> {
        self.mem.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> BoxFut<'_, IoResult<()>> {
        self.mem.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: ZeroFlags) -> BoxFut<'_, IoResult<()>> {
        self.mem.write_zeroes(offset, len, flags)
    }
    fn connect(&self) -> Option<Arc<dyn BlockDev>> {
        Some(Arc::new(Handle { mem: self.mem.clone(), released: self.released.clone(), connection: true }))
    }
}

/// A forced removal is over only once its connections have let go of the device: nothing of
/// the export is held when `Removed::closed` returns (so its files can be opened again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_closes_once_connections_have_let_go_of_the_device() {
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dev = Handle { mem: Arc::new(MemDev::new(SIZE)), released: released.clone(), connection: false };
    let export = Export { name: "h".into(), description: String::new(), dev: Arc::new(dev), read_only: false };
    let server = Server::new(vec![export], Limits::default()).unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    server.spawn_connection(theirs);
    let mut c = strata_nbd::client::Client::handshake(ours, "h").await.unwrap();
    c.read(0, 4096).await.unwrap();
    let removed = server.remove("h", true).unwrap();
    removed.closed().await;
    assert!(released.load(std::sync::atomic::Ordering::SeqCst), "the connection still held the device");
    assert_eq!(Arc::strong_count(&removed.export), 1, "the connection still held the export");
}

/// A client that has disconnected (sent NBD_CMD_DISC and seen the server close) no longer
/// counts: the export can be removed without force at once. (And a server shutting down
/// takes no new export: it would not be closed with the others.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_client_no_longer_holds_its_export() {
    let mem: Arc<dyn BlockDev> = Arc::new(MemDev::new(SIZE));
    let export = || Export { name: "d".into(), description: String::new(), dev: mem.clone(), read_only: false };
    let server = Server::new(vec![export()], Limits::default()).unwrap();
    for round in 0..1000 {
        let (ours, theirs) = UnixStream::pair().unwrap();
        server.spawn_connection(theirs);
        let mut c = strata_nbd::client::Client::handshake(ours, "d").await.unwrap();
        c.read(0, 4096).await.unwrap();
        c.disconnect().await.unwrap();
        let removed = server.remove("d", false).unwrap_or_else(|e| panic!("round {round}: {e}"));
        removed.closed().await;
        server.add(export()).unwrap();
    }
    server.remove("d", false).unwrap();
    server.shutdown();
    let e = server.add(export()).err().expect("refused");
    assert!(e.contains("shutting down"), "a server shutting down takes no new export: {e}");
}

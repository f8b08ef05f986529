//! Every trace format on hand-written lines, malformed lines (the error must name the line),
//! format guessing, and compressed input.

mod common;

use std::io::Write;

use strata_sim::trace::{self, Format, IoKind, Request, TraceError, NAMESPACE_SHIFT};

fn parse(text: &str, format: Format) -> Vec<Request> {
    trace::parse_str(text, Some(format)).unwrap().0
}

fn error_line(text: &str, format: Option<Format>) -> u64 {
    match trace::parse_str(text, format) {
        Err(TraceError::Malformed { line, .. }) => line,
        other => panic!("expected a malformed-line error, got {other:?}"),
    }
}

fn req(time_ns: Option<u64>, offset: u64, len: u64, kind: IoKind) -> Request {
    Request { time_ns, offset, len, kind }
}

#[test]
fn msr() {
    let text = "128166372003061629,wdev,0,Read,3154132992,4096,2170\n\
                128166372016853796,wdev,1,Write,1024,512,75\n";
    let r = parse(text, Format::Msr);
    assert_eq!(r[0], req(Some(12_816_637_200_306_162_900), 3_154_132_992, 4096, IoKind::Read));
    assert_eq!(r[1], req(Some(12_816_637_201_685_379_600), (1 << NAMESPACE_SHIFT) | 1024, 512, IoKind::Write));
    assert_eq!(error_line("128166372003061629,wdev,0,Read,3154132992,4096,2170\n1,2,3\n", Some(Format::Msr)), 2);
    assert_eq!(error_line("1,h,0,Read,0,8,1\n\n1,h,0,Erase,0,8,1\n", Some(Format::Msr)), 3);
    assert_eq!(error_line("x,h,0,Read,0,8,1\n", Some(Format::Msr)), 1);
}

#[test]
fn fio_v2_and_v3() {
    let v2 = "fio version 2 iolog\n/dev/sdb add\n/dev/sdb open\n/dev/sdb read 4096 8192\n\
              /dev/sdb write 0 512\n/dev/sdb trim 0 4096\n/dev/sdc add\n/dev/sdc read 0 4096\n/dev/sdb close\n";
    let r = parse(v2, Format::Fio);
    assert_eq!(r.len(), 3);
    assert_eq!(r[0], req(None, 4096, 8192, IoKind::Read));
    assert_eq!(r[1], req(None, 0, 512, IoKind::Write));
    assert_eq!(r[2], req(None, 1 << NAMESPACE_SHIFT, 4096, IoKind::Read));
    let v3 = "fio version 3 iolog\n0 f add\n3 f open\n878 f write 0 16384\n891 f read 16384 4096\n1677 f close\n";
    let r = parse(v3, Format::Fio);
    assert_eq!(r, vec![req(Some(878_000), 0, 16384, IoKind::Write), req(Some(891_000), 16384, 4096, IoKind::Read)]);
    assert_eq!(error_line("/dev/sdb read 0 4096\n", Some(Format::Fio)), 1);
    assert_eq!(error_line("fio version 2 iolog\nf add\nf read 0\n", Some(Format::Fio)), 3);
    assert_eq!(error_line("fio version 3 iolog\nx f read 0 4096\n", Some(Format::Fio)), 2);
    assert_eq!(error_line("fio version 2 iolog\nf add\nf frobnicate 0 1\n", Some(Format::Fio)), 3);
}

#[test]
fn blkparse() {
    let text = "  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]\n\
                  8,0    3        2     0.000001000   697  G   W 223490 + 8 [kjournald]\n\
                  8,0    3        3     0.000003000   697  D   W 223490 + 8 [kjournald]\n\
                  8,0    0        0     0.000400000     0  m   N cfq697 slice expired\n\
                  8,0    1        4     1.500000000   700  Q  RA 100 + 16 [cat]\n\
                  8,0    1        5     1.600000000   700  Q FWS 0 + 0 [sync]\n\
                  8,0    1        6     1.700000000   700  Q   D 4096 + 64 [fstrim]\n\
                  8,0    3        7     2.000000000   697  C   W 223490 + 8 [0]\n\
                  8,16   0        8     2.5           701  Q   R 8 + 8 [dd]\n\
                CPU0 (8,0):\n Reads Queued:           1,        8KiB\n";
    let r = parse(text, Format::Blkparse);
    assert_eq!(
        r,
        vec![
            req(Some(0), 223_490 * 512, 4096, IoKind::Write),
            req(Some(1_500_000_000), 100 * 512, 8192, IoKind::Read),
            req(Some(2_500_000_000), (1 << NAMESPACE_SHIFT) | 4096, 4096, IoKind::Read),
        ]
    );
    assert_eq!(error_line("  8,0 3 1 0.0 697 Q W abc + 8 [x]\n", Some(Format::Blkparse)), 1);
    assert_eq!(error_line("  8,0 3 1 0.0 697 Q W 1 + 8 [x]\n  8,0 3\n", Some(Format::Blkparse)), 2);
    assert_eq!(error_line("  8,0 3 1 zero 697 Q W 1 + 8 [x]\n", Some(Format::Blkparse)), 1);
}

#[test]
fn cloudphysics() {
    let text = "version,time,op,size,lbn\n1,5633898,2a,512,42932745\n1,5633899,28,65536,100\n1,5633899,35,0,0\n";
    let r = parse(text, Format::Cloudphysics);
    assert_eq!(
        r,
        vec![
            req(Some(5_633_898_000_000_000), 42_932_745 * 512, 512, IoKind::Write),
            req(Some(5_633_899_000_000_000), 51_200, 65536, IoKind::Read),
        ]
    );
    assert_eq!(error_line("version,time,op,size,lbn\n1,2,zz,512,1\n", Some(Format::Cloudphysics)), 2);
    assert_eq!(error_line("1,2,28,512\n", Some(Format::Cloudphysics)), 1);
}

#[test]
fn lis() {
    let r = parse("100 8 0 1\n  7 1 0 2\n", Format::Lis);
    assert_eq!(r, vec![req(None, 51_200, 4096, IoKind::Read), req(None, 3584, 512, IoKind::Read)]);
    assert_eq!(Format::Lis.native_block_size(), Some(512));
    assert_eq!(error_line("100 8 0 1\n100 8 0\n", Some(Format::Lis)), 2);
    assert_eq!(error_line("100 -8 0 1\n", Some(Format::Lis)), 1);
}

#[test]
fn alibaba() {
    let r = parse("3,R,126703644672,4096,1577808000000005\n4,W,0,512,1577808000000105\n", Format::Alibaba);
    assert_eq!(
        r[0],
        req(Some(1_577_808_000_000_005_000), (3 << NAMESPACE_SHIFT) | 126_703_644_672, 4096, IoKind::Read)
    );
    assert_eq!(r[1].kind, IoKind::Write);
    assert_eq!(error_line("3,X,0,4096,1\n", Some(Format::Alibaba)), 1);
    assert_eq!(error_line("3,R,0,4096,1\n3,R,0,4096\n", Some(Format::Alibaba)), 2);
}

#[test]
fn tencent() {
    let r = parse(
        "Timestamp,Offset,Size,IOType,VolumeID\n1538323200,12345,8,0,1063\n1538323201,0,16,1,1063\n",
        Format::Tencent,
    );
    assert_eq!(
        r[0],
        req(Some(1_538_323_200_000_000_000), (1063 << NAMESPACE_SHIFT) | (12_345 * 512), 4096, IoKind::Read)
    );
    assert_eq!(r[1], req(Some(1_538_323_201_000_000_000), 1063 << NAMESPACE_SHIFT, 8192, IoKind::Write));
    assert_eq!(error_line("1538323200,12345,8,2,1063\n", Some(Format::Tencent)), 1);
}

#[test]
fn guesses_formats() {
    let cases = [
        ("128166372003061629,wdev,0,Read,3154132992,4096,2170\n", Format::Msr),
        ("fio version 3 iolog\n0 f add\n", Format::Fio),
        ("  8,0    3        1     0.000000000   697  Q   W 223490 + 8 [kjournald]\n", Format::Blkparse),
        ("version,time,op,size,lbn\n1,5633898,2a,512,42932745\n", Format::Cloudphysics),
        ("1,5633898,2a,512,42932745\n", Format::Cloudphysics),
        ("100 8 0 1\n", Format::Lis),
        ("3,R,126703644672,4096,1577808000000005\n", Format::Alibaba),
        ("1538323200,12345,8,0,1063\n", Format::Tencent),
    ];
    for (text, want) in cases {
        assert_eq!(trace::parse_str(text, None).unwrap().1, want, "{text}");
    }
    assert!(matches!(trace::parse_str("hello world\n", None), Err(TraceError::UnknownFormat(_))));
    // A guessed format still reports the right line for a bad record further down.
    assert_eq!(error_line("100 8 0 1\n100 8 0 2\n\nbad\n", None), 4);
    // A byte-order mark (a CSV saved on Windows) and a long comment block before the records.
    let bom = "\u{feff}version,time,op,size,lbn\n1,5633898,2a,512,42932745\n";
    let (r, f) = trace::parse_str(bom, None).unwrap();
    assert_eq!((f, r.len()), (Format::Cloudphysics, 1));
    assert_eq!(parse("\u{feff}100 8 0 1\n", Format::Lis).len(), 1);
    let commented = format!("{}100 8 0 1\n", "# a comment\n".repeat(40));
    assert_eq!(trace::parse_str(&commented, None).unwrap().1, Format::Lis);
}

/// A request whose length runs past its device's 256 TiB, into the next device's offsets
/// (or past 2^64), is a malformed record: its blocks are never made.
#[test]
fn a_request_longer_than_its_device_is_refused() {
    assert_eq!(error_line("1,h,0,Read,0,18446744073709551615,1\n", Some(Format::Msr)), 1);
    let edge = (1u64 << NAMESPACE_SHIFT) - 4096;
    assert_eq!(parse(&format!("1,h,0,Read,{edge},4096,1\n"), Format::Msr).len(), 1);
    assert_eq!(error_line(&format!("1,h,0,Read,0,8,1\n1,h,0,Read,{edge},8192,1\n"), Some(Format::Msr)), 2);
    // blkparse times that overflow nanoseconds.
    let line = "  8,0    3        1     18446744074.000000000   697  Q   W 223490 + 8 [kjournald]\n";
    assert_eq!(error_line(line, Some(Format::Blkparse)), 1);
}

#[test]
fn reads_gzip_and_zstd() {
    let text = "100 8 0 1\n200 8 0 2\n";
    let dir = tempfile::tempdir().unwrap();
    let gz = dir.path().join("t.lis.gz");
    let mut e = flate2::write::GzEncoder::new(std::fs::File::create(&gz).unwrap(), flate2::Compression::default());
    e.write_all(text.as_bytes()).unwrap();
    e.finish().unwrap();
    let zst = dir.path().join("t.lis.zst");
    std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
    let plain = dir.path().join("t.lis");
    std::fs::write(&plain, text).unwrap();
    for path in [gz, zst, plain] {
        let reader = trace::open_reader(&path).unwrap();
        let (reqs, format) = trace::Requests::new(reader, None).unwrap();
        assert_eq!(format, Format::Lis);
        let reqs: Vec<_> = reqs.collect::<Result<_, _>>().unwrap();
        assert_eq!(reqs.len(), 2, "{}", path.display());
        assert_eq!(reqs[1].offset, 200 * 512);
    }
}

#[test]
fn the_cloudphysics_sample_parses() {
    let Some((reqs, format)) = common::testdata("cloudphysics-w.csv") else {
        return;
    };
    assert_eq!(format, Format::Cloudphysics);
    let reqs: Vec<_> = reqs.collect::<Result<_, _>>().unwrap();
    // 113,872 requests: 66,898 writes (0x2a) and 46,974 reads (0x28).
    assert_eq!(reqs.len(), 113_872);
    assert_eq!(reqs.iter().filter(|r| r.kind == IoKind::Read).count(), 46_974);
}

/// A request that ends at the very end of the address space (the last namespace's last
/// byte, 2^64) splits into its blocks like any other: the end of its last block does not
/// wrap around to 0 (which made the split loop forever).
#[test]
fn a_request_ending_at_the_end_of_the_address_space_splits_into_its_blocks() {
    use strata_sim::sim::{split_requests, Ops};
    for (block_size, accesses) in [(4096, 1), (1, 4096), (3, 1366), (1000, 5)] {
        let last = [Ok(req(None, u64::MAX - 4095, 4096, IoKind::Read))];
        let w = split_requests(last, block_size, Ops::All, 1).unwrap();
        assert_eq!(w.accesses.len(), accesses, "blocks of {block_size}");
        assert_eq!(w.accesses.iter().map(|a| a.bytes as u64).sum::<u64>(), 4096, "blocks of {block_size}");
        assert_eq!(w.max_block, u64::MAX / block_size, "blocks of {block_size}");
    }
}

/// A trace that would split into more accesses than a replay holds is refused before they
/// are made: one 4 GiB request in 1-byte blocks is 2^32 of them.
#[test]
fn a_trace_of_too_many_accesses_is_refused_before_it_is_split() {
    use strata_sim::sim::{split_requests, Ops, MAX_ACCESSES};
    let huge = [Ok(req(None, 0, 4 << 30, IoKind::Read))];
    match split_requests(huge, 1, Ops::All, 1) {
        Err(e @ TraceError::TooManyAccesses(..)) => assert!(e.to_string().contains("larger --block-size"), "{e}"),
        other => panic!("expected too many accesses, got {:?}", other.map(|w| w.accesses.len())),
    }
    // The count is of the whole trace: many requests, each small, add up to it too.
    let last = MAX_ACCESSES * 4096;
    let many = [Ok(req(None, 0, 4096, IoKind::Read)), Ok(req(None, last - 4096, MAX_ACCESSES * 4096, IoKind::Read))];
    assert!(matches!(split_requests(many, 4096, Ops::All, 1), Err(TraceError::TooManyAccesses(MAX_ACCESSES, 4096))));
}

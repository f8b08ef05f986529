//! A RAM device that cannot get memory for a new chunk fails that write with ENOSPC and
//! keeps what it holds, rather than aborting the process. In a test binary of its own: it
//! caps the address space of the whole process.

use strata_io::mem::MemDev;
use strata_io::ErrorKind;

#[test]
fn a_write_the_kernel_has_no_memory_for_fails_with_enospc() {
    let dev = MemDev::new(64 << 30);
    dev.write_from(0, &[7u8; 4096]).expect("first chunk");
    strata_io::testing::cap_address_space(Some(256 << 20));
    let mut refused = None;
    for chunk in 1..1024u64 {
        if let Err(e) = dev.write_from(chunk << 21, &[1u8; 4096]) {
            refused = Some((chunk, e));
            break;
        }
    }
    let (chunk, e) = refused.expect("the address-space cap never refused a chunk");
    assert_eq!(e.kind, ErrorKind::NoSpace, "{e}");
    assert!(chunk > 1, "refused at chunk {chunk}, before the cap was reached");
    let mut back = [0u8; 4096];
    dev.read_into(0, &mut back).unwrap();
    assert_eq!(back, [7u8; 4096], "data written before the refusal is intact");
}

//! Helpers shared by the integration tests.

use std::io::BufRead;
use std::path::Path;

use strata_sim::trace::{open_reader, Format, Requests};

/// A trace of the shared test data (`../shared/testdata` next to the repository, `name`
/// relative to it) opened for parsing, with the format guessed from its content; or `None`,
/// after saying the test is skipped, when it is not there. Under CI (`CI=true`) a missing
/// trace fails the test: a checkout without it would pass these tests without running them.
pub fn testdata(name: &str) -> Option<(Requests<Box<dyn BufRead + Send>>, Format)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/testdata").join(name);
    if !path.exists() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{} not present (CI=true)", path.display());
        eprintln!("SKIP: {} not present", path.display());
        return None;
    }
    Some(Requests::new(open_reader(&path).unwrap(), None).unwrap())
}

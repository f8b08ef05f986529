//! What the tests of bad input share: a record of panics on the runtime's worker threads.

use std::sync::{Mutex, Once};

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records panics on tokio worker threads (where the server's and the client's tasks run),
/// keeping the default report too.
pub fn watch_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("").to_string();
            // Worker threads are "tokio-runtime-worker" or "tokio-rt-worker" by version.
            if thread.starts_with("tokio-") {
                PANICS.lock().unwrap().push(format!("{info}"));
            }
            default(info);
        }));
    });
}

/// Fails if a worker thread panicked, naming `who` (the server, the client).
pub fn assert_no_panics(who: &str) {
    let panics = PANICS.lock().unwrap();
    assert!(panics.is_empty(), "{who} panicked: {panics:#?}");
}

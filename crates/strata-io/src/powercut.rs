//! Power-cut simulation (test support): records writes and flushes so a crash can be replayed.
//! Filled in by the reliability work.

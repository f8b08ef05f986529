//! Fault injection (test support): a decorator that fails chosen requests of the device it
//! wraps. Filled in by the reliability work.

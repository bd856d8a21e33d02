//! Looking after receipt trees once runs are done: `show` (one run or one node of it), `ls`
//! (every run under a receipts folder, per commit, with verdict counts) and `gc` (delete all
//! but the newest runs of each manifest).
//!
//! Finding and reading trees is `diff::resolve` and `diff::load`; this module only presents
//! them and, for `gc`, removes whole trees under the run lock.

pub mod gc;
pub mod ls;
pub mod show;

//! Trusted imports: records that enter the WMS from its owners rather than
//! through lifecycle commands — Gate approvals, registered change sets, and
//! work items restored from a backup or migrated from another backend.

use crate::{Import, txn::WmsTxn};

/// Writes one imported record.
pub fn apply(txn: &mut dyn WmsTxn, import: Import) {
    match import {
        Import::Record(r) => txn.put_record(r),
        Import::Approval(a) => txn.put_approval(a),
        Import::ChangeSet(c) => txn.put_change_set(c),
        Import::Submission(s) => txn.put_submission(s),
    }
}

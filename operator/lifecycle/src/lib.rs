//! validation-rules/v1: the work-item lifecycle ruleset and its pure evaluator.

//! `protobot rules evaluate`: the lifecycle evaluator's inspection tool (wired by the lifecycle work).

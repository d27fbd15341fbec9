//! The pure core of cost metering (issue 34): token counts by kind ([`tokens`]), prices per
//! model in integer micro-dollars ([`price`]), what one run used by model as the egress
//! proxy's meter records it ([`run`]), and a work item's bounded, idempotent usage ledger
//! with its summary per stage and tier ([`ledger`]), and items' budgets ([`budget`]).
//!
//! No I/O, no clock, no network: the egress proxy (which reads usage from model answers and
//! serves it), the Job Site (which reads it back after each run) and the stores (which keep
//! the ledger in the work-item record) all build on these values.

pub mod budget;
pub mod ledger;
pub mod price;
pub mod run;
pub mod tokens;

pub use budget::{BudgetStop, Dollars, DollarsError, ItemBudget};
pub use ledger::{RunSpend, Spend, Stage, UsageLedger, UsageSummary};
pub use price::{Microdollars, ModelPrice, PerMillion, PriceTable};
pub use run::{ModelUsage, RunUsage};
pub use tokens::{TokenCounts, TokenKind};

//! The forge's checks waits shown on a project's items as their `AwaitingChecks` condition
//! ([`show_checks_waits`]): visibility only, never a store write.

use jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use protobot_api::BuildWorkItem;

/// Shows the forge's checks waits on the project's items as their `AwaitingChecks`
/// condition (`True` while the landing waits for required checks, `False` once it no longer
/// does). Visibility only: a failure is logged and retried by the next pass, and the status
/// write carries the item's resourceVersion, so it never overwrites a store write (the store
/// retries its own on the conflict and keeps the condition).
pub(super) async fn show_checks_waits(
    client: &Client,
    ns: &str,
    project: &str,
    forge: &crate::forge::ProjectForge,
) {
    if !forge.checks_to_show() {
        return;
    }
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), ns);
    let selector = format!(
        "{}={}",
        protobot_stores::kubernetes::PROJECT_LABEL,
        protobot_stores::kubernetes::label_value(project)
    );
    let listed = match items
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    {
        Ok(l) => l.items,
        Err(error) => {
            tracing::warn!(project, %error, "could not list work items to show checks waits");
            return;
        }
    };
    let waits = forge.waits.current();
    let mut showing = std::collections::BTreeSet::new();
    for (name, resource_version, status) in
        crate::forge::awaiting_checks_updates(&listed, &waits, Timestamp::now())
    {
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": resource_version},
            "status": {"conditions": status.conditions},
        });
        if let Err(error) = items
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::debug!(project, item = %name, %error, "could not show a checks wait; next pass");
        }
    }
    for item in &listed {
        if waits
            .iter()
            .any(|w| w.work_item_id == item.spec.work_item_id)
        {
            showing.insert(item.name_any());
        }
    }
    forge.showing(showing);
}

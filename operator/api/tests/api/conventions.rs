//! Every CRD follows the conventions of ARCHITECTURE.md §2: namespaced, status subresource,
//! printer columns (that point at real fields of the right type), short names, and the
//! `protobot` category.

use protobot_api::{CATEGORY, GROUP, VERSION, crdgen};
use serde_json::Value;

use crate::util::{crd_json, root_schema};

/// Kind → (plural, short name) as documented in the crate root.
const KINDS: [(&str, &str, &str); 5] = [
    ("Project", "projects", "pbproj"),
    ("ChangeSet", "changesets", "pbcs"),
    ("BugReport", "bugreports", "pbbug"),
    ("BuildWorkItem", "buildworkitems", "bwi"),
    ("InspectionRun", "inspectionruns", "pbir"),
];

#[test]
fn every_kind_has_exactly_one_crd_in_the_documented_order() {
    let kinds: Vec<String> = crdgen::all_crds()
        .into_iter()
        .map(|crd| crd.spec.names.kind)
        .collect();
    let documented: Vec<&str> = KINDS.iter().map(|(kind, _, _)| *kind).collect();
    assert_eq!(kinds, documented);
}

#[test]
fn every_crd_is_namespaced_in_the_protobot_group_and_category() {
    for (kind, plural, short) in KINDS {
        let crd = crd_json(kind);
        assert_eq!(
            crd["metadata"]["name"],
            format!("{plural}.{GROUP}"),
            "{kind}"
        );
        assert_eq!(crd["spec"]["group"], GROUP, "{kind}");
        assert_eq!(crd["spec"]["scope"], "Namespaced", "{kind}");
        assert_eq!(crd["spec"]["names"]["plural"], plural, "{kind}");
        assert_eq!(
            crd["spec"]["names"]["categories"],
            serde_json::json!([CATEGORY]),
            "{kind}"
        );
        assert_eq!(
            crd["spec"]["names"]["shortNames"],
            serde_json::json!([short]),
            "{kind}"
        );
    }
}

#[test]
fn short_names_are_unique() {
    let mut shorts: Vec<&str> = KINDS.iter().map(|(_, _, short)| *short).collect();
    shorts.sort_unstable();
    shorts.dedup();
    assert_eq!(shorts.len(), KINDS.len());
}

#[test]
fn every_crd_serves_and_stores_v1alpha1_with_the_status_subresource() {
    for (kind, _, _) in KINDS {
        let crd = crd_json(kind);
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], VERSION, "{kind}");
        assert_eq!(version["served"], true, "{kind}");
        assert_eq!(version["storage"], true, "{kind}");
        assert_eq!(
            version["subresources"]["status"],
            serde_json::json!({}),
            "{kind}"
        );
        let schema = root_schema(kind);
        assert_eq!(schema["properties"]["status"]["type"], "object", "{kind}");
    }
}

#[test]
fn every_crd_has_printer_columns_ending_with_age() {
    for (kind, _, _) in KINDS {
        let columns = printer_columns(kind);
        assert!(columns.len() >= 3, "{kind} has too few printer columns");
        let last = columns.last().unwrap();
        assert_eq!(last["name"], "Age", "{kind}");
        assert_eq!(last["jsonPath"], ".metadata.creationTimestamp", "{kind}");
    }
}

#[test]
fn a_blocked_item_shows_its_question_in_the_wide_listing() {
    let question = printer_columns("BuildWorkItem")
        .into_iter()
        .find(|c| c["name"] == "Question")
        .expect("a Question column");
    assert_eq!(question["jsonPath"], ".status.blockReason");
    assert_eq!(question["priority"], 1, "only with -o wide");
}

#[test]
fn build_work_item_columns_are_state_priority_holder_version() {
    let names: Vec<String> = printer_columns("BuildWorkItem")
        .iter()
        .filter(|c| c["priority"].is_null())
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "State", "Priority", "Holder", "Version", "Ready", "Reason", "Age"
        ]
    );
}

/// `kubectl get` on any kind answers "is it ready, and if not why" (docs/gitops.md).
#[test]
fn every_crd_shows_the_ready_condition_and_its_reason() {
    for (kind, _, _) in KINDS {
        let columns = printer_columns(kind);
        for (name, field) in [("Ready", "status"), ("Reason", "reason")] {
            let column = columns
                .iter()
                .find(|c| c["name"] == name)
                .unwrap_or_else(|| panic!("{kind} has no {name} column"));
            assert_eq!(
                column["jsonPath"],
                format!(".status.conditions[?(@.type==\"Ready\")].{field}"),
                "{kind}"
            );
            assert!(
                column["priority"].is_null(),
                "{kind}: {name} is shown by default"
            );
        }
    }
}

/// A printer column whose path names no field shows an empty cell forever; one whose type
/// disagrees with the field is rendered wrongly. Derive both from the schema.
#[test]
fn printer_columns_point_at_schema_fields_of_the_declared_type() {
    for (kind, _, _) in KINDS {
        let root = root_schema(kind);
        for column in printer_columns(kind) {
            let path = column["jsonPath"].as_str().unwrap();
            let declared = column["type"].as_str().unwrap();
            if path == ".metadata.creationTimestamp" {
                assert_eq!(declared, "date");
                continue;
            }
            let field = field_for_json_path(&root, path)
                .unwrap_or_else(|| panic!("{kind}: column path {path} names no schema field"));
            let expected = match (field["type"].as_str(), field["format"].as_str()) {
                (Some("string"), Some("date-time")) => "date",
                (Some(other), _) => other,
                (None, _) => panic!("{kind}: {path} has no type"),
            };
            assert_eq!(declared, expected, "{kind}: column {path}");
        }
    }
}

fn printer_columns(kind: &str) -> Vec<Value> {
    crd_json(kind)["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Resolves `.a.b.c` and `.status.conditions[?(@.type=="X")].status` to a field schema.
fn field_for_json_path(root: &Value, path: &str) -> Option<Value> {
    // Filters such as `[?(@.type=="X")]` contain dots; reduce them to a plain marker first.
    let filter = regex::Regex::new(r"\[[^\]]*\]").unwrap();
    let path = filter.replace_all(path, "[]");
    let mut schema = root.clone();
    for step in path.trim_start_matches('.').split('.') {
        let (name, filtered) = match step.split_once('[') {
            Some((name, _filter)) => (name, true),
            None => (step, false),
        };
        schema = schema["properties"].get(name)?.clone();
        if filtered {
            schema = schema.get("items")?.clone();
        }
    }
    Some(schema)
}

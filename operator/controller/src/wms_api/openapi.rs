//! The OpenAPI 3.1 description of the WMS API, generated from the Rust types
//! of [`super::wire`] (schemars, JSON Schema 2020-12 as OpenAPI 3.1 uses it).
//! The committed copy is `docs/wms-api.openapi.json`; a test fails when it is
//! not what this module generates (regenerate: `PROTOBOT_BLESS=1 cargo nextest
//! run -p protobot-controller openapi`).

use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use super::{
    Problem,
    wire::{OperationAnswer, ReadAnswer, StoreRead},
};

/// The document.
pub fn document() -> Value {
    let mut generator = SchemaSettings::draft2020_12()
        .with(|s| s.definitions_path = "/components/schemas".into())
        .into_generator();
    let envelope = generator.subschema_for::<protobot_lifecycle::OperationEnvelope>();
    let read = generator.subschema_for::<StoreRead>();
    let operation_answer = generator.subschema_for::<OperationAnswer>();
    let read_answer = generator.subschema_for::<ReadAnswer>();
    let problem = generator.subschema_for::<Problem>();
    let schemas = generator.take_definitions(true);
    let problem_response = |what: &str| json!({"description": what, "content": {"application/json": {"schema": problem}}});
    let path_params = json!([
        {"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"},
         "description": "The Project's namespace."},
        {"name": "project", "in": "path", "required": true, "schema": {"type": "string"},
         "description": "The Project's name (the WMS project id)."}
    ]);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "protobot WMS Adapter API",
            "version": "v1",
            "description": "Every operation of the WMS Adapter API (contracts/lifecycle.md), evaluated by validation-rules/v1 on the Project's Kubernetes work store. The caller authenticates with a Kubernetes bearer token (TokenReview); each operation is authorized by a SubjectAccessReview of verb = operation name on resource wmsoperations/<role> in group protobot.dev, named after the Project; each ref a payload names (a merge envelope's target, integration head, merge commit and inspection run) by verb target, commit or inspection-run on wmsrefs/<project>, named after the ref; a store read by verb get on wmsreads/<kind>. The trusted authorization context is built from the reviewed caller, never from the request. A rejection is an ordinary 200 answer with its stable code. See docs/wms-api.md."
        },
        "security": [{"bearer": []}],
        "paths": {
            "/wms/v1/namespaces/{namespace}/projects/{project}/operations": {
                "post": {
                    "operationId": "execute",
                    "summary": "Execute one adapter operation",
                    "parameters": path_params.as_array().cloned().unwrap_or_default().into_iter().chain([
                        json!({"name": "role", "in": "query", "required": true,
                               "schema": {"type": "string", "enum": protobot_lifecycle::Role::ALL.iter().map(|r| r.as_str()).collect::<Vec<_>>()},
                               "description": "The role the caller acts in (authorized as the subresource of wmsoperations)."}),
                        json!({"name": "dryRun", "in": "query", "required": false, "schema": {"type": "boolean"},
                               "description": "Answer what the rules would decide now; nothing is written."}),
                    ]).collect::<Vec<_>>(),
                    "requestBody": {"required": true, "content": {"application/json": {"schema": envelope}}},
                    "responses": {
                        "200": {"description": "The answer: the library's result envelope (a rejection included), the trusted actor and the audit events the call produced.",
                                "content": {"application/json": {"schema": operation_answer}}},
                        "400": problem_response("The body is not one operation envelope, or the query names no known role."),
                        "401": problem_response("No bearer token, or the API server did not authenticate it. Nothing was read or written."),
                        "403": problem_response("The caller may not perform this operation in this role on this Project, or may not name one of the payload's refs. Nothing was read or written."),
                        "404": problem_response("No such Project."),
                        "503": problem_response("The work store or the API server's reviews are unavailable (WMS_UNAVAILABLE): read first, then retry with the same idempotency key.")
                    }
                }
            },
            "/wms/v1/namespaces/{namespace}/projects/{project}/reads": {
                "post": {
                    "operationId": "read",
                    "summary": "Read a record the work store holds",
                    "parameters": path_params,
                    "requestBody": {"required": true, "content": {"application/json": {"schema": read}}},
                    "responses": {
                        "200": {"description": "What the store holds (found: false when the object does not exist).",
                                "content": {"application/json": {"schema": read_answer}}},
                        "400": problem_response("The body is not one store read."),
                        "401": problem_response("No bearer token, or the API server did not authenticate it."),
                        "403": problem_response("The caller may not get this kind of record on this Project."),
                        "404": problem_response("No such Project."),
                        "503": problem_response("The work store is unavailable.")
                    }
                }
            },
            "/wms/v1/openapi.json": {
                "get": {
                    "operationId": "openapi",
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": {"description": "The OpenAPI description.", "content": {"application/json": {}}}}
                }
            }
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "A Kubernetes token (e.g. `kubectl create token <serviceaccount> --audience protobot-wms`)."}
            },
            "schemas": schemas
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const COMMITTED: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/wms-api.openapi.json"
    );

    #[test]
    fn the_committed_openapi_description_is_current() {
        let generated = format!("{}\n", serde_json::to_string_pretty(&document()).unwrap());
        if std::env::var_os("PROTOBOT_BLESS").is_some() {
            std::fs::write(COMMITTED, &generated).unwrap();
        }
        let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
        assert!(
            committed == generated,
            "docs/wms-api.openapi.json is not what the Rust types generate: run `PROTOBOT_BLESS=1 cargo nextest run -p protobot-controller openapi` and commit the file"
        );
    }

    #[test]
    fn the_description_names_every_schema_it_references() {
        let doc = document();
        let schemas = doc["components"]["schemas"].as_object().unwrap();
        for name in [
            "OperationEnvelope",
            "OperationAnswer",
            "ResultEnvelope",
            "AuditEvent",
            "StoreRead",
            "ReadAnswer",
            "WorkItemRecord",
            "RequestRecord",
            "Submission",
            "FindingRecord",
            "Problem",
            "Code",
        ] {
            assert!(schemas.contains_key(name), "{name} is described");
        }
        let text = doc.to_string();
        for (i, _) in text.match_indices("#/components/schemas/") {
            let rest = &text[i + "#/components/schemas/".len()..];
            let name: String = rest.chars().take_while(|c| *c != '"').collect();
            assert!(schemas.contains_key(&name), "dangling reference to {name}");
        }
    }
}

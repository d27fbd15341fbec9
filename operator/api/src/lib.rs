//! protobot custom resource types (protobot.dev/v1alpha1) and CRD generation.

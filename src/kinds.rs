//! Kind ⇄ plural resource names, as the API server spells them (`Ingress` → `ingresses`,
//! `EndpointSlice` → `endpointslices`, `GatewayClass` → `gatewayclasses`, `Endpoints` →
//! `endpoints`). Used where objects arrive without discovery (fixtures, manifests).

/// Kinds users commonly watch; their plurals follow the rules below except where noted, and
/// they let a plural be turned back into its properly-cased kind.
const KNOWN_KINDS: &[&str] = &[
    "ConfigMap",
    "Endpoints",
    "EndpointSlice",
    "Event",
    "GRPCRoute",
    "Gateway",
    "GatewayClass",
    "HTTPRoute",
    "Ingress",
    "IngressClass",
    "Lease",
    "Namespace",
    "NetworkPolicy",
    "Node",
    "Pod",
    "ReferenceGrant",
    "Secret",
    "Service",
    "ServiceAccount",
    "TCPRoute",
    "TLSRoute",
    "UDPRoute",
    "BackendTLSPolicy",
    "HAProxyTemplateConfig",
    "HAProxyCfg",
    "CustomResourceDefinition",
];

/// The plural resource name of a kind, by the rules the API server's defaulting uses.
pub(crate) fn plural_of(kind: &str) -> String {
    let lower = kind.to_ascii_lowercase();
    if lower == "endpoints" {
        return lower;
    }
    if lower.ends_with('s')
        || lower.ends_with('x')
        || lower.ends_with('z')
        || lower.ends_with("ch")
        || lower.ends_with("sh")
    {
        return format!("{lower}es");
    }
    if let Some(stem) = lower.strip_suffix('y') {
        if !stem.ends_with(['a', 'e', 'i', 'o', 'u']) {
            return format!("{stem}ies");
        }
    }
    format!("{lower}s")
}

/// The kind for a plural resource name: exact for known kinds, else a best guess
/// (`widgets` → `Widget`).
pub(crate) fn kind_of(plural: &str) -> String {
    if let Some(kind) = KNOWN_KINDS.iter().find(|k| plural_of(k) == plural) {
        return kind.to_string();
    }
    let singular = if let Some(stem) = plural.strip_suffix("ies") {
        format!("{stem}y")
    } else if let Some(stem) = plural.strip_suffix("sses") {
        format!("{stem}ss")
    } else {
        plural.strip_suffix('s').unwrap_or(plural).to_string()
    };
    let mut chars = singular.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plurals_match_the_api_server() {
        let cases = [
            ("Ingress", "ingresses"),
            ("EndpointSlice", "endpointslices"),
            ("GatewayClass", "gatewayclasses"),
            ("Endpoints", "endpoints"),
            ("NetworkPolicy", "networkpolicies"),
            ("HTTPRoute", "httproutes"),
            ("Service", "services"),
            ("Gateway", "gateways"),
            ("IngressClass", "ingressclasses"),
            ("BackendTLSPolicy", "backendtlspolicies"),
            ("Namespace", "namespaces"),
        ];
        for (kind, plural) in cases {
            assert_eq!(plural_of(kind), plural, "{kind}");
            assert_eq!(kind_of(plural), kind, "{plural}");
        }
        assert_eq!(kind_of("widgets"), "Widget");
    }
}

//! Tokens signed here, keys served by a real HTTP server on loopback: every
//! check of [`Issuers::verify`], and the bounds of the key fetches.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{EncodingKey, Header};
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use super::*;

const AUDIENCE: &str = "toolfleet";

/// A signing key of the test issuer, with its public JWK.
struct Signer {
    kid: String,
    key: EncodingKey,
    jwk: Jwk,
}

impl Signer {
    fn new(kid: &str) -> Self {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let key = EncodingKey::from_ec_der(&pair.serialize_der());
        let mut jwk = Jwk::from_encoding_key(&key, Algorithm::ES256).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        Self {
            kid: kid.to_owned(),
            key,
            jwk,
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.key).unwrap()
    }
}

fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

/// An issuer on `server`: its discovery document and its JWKS of `keys`.
async fn serve(server: &MockServer, keys: &[&Signer]) {
    server.reset().await;
    let issuer = server.uri();
    Mock::given(method("GET"))
        .and(path("/.well-known/openid-configuration"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "issuer": issuer, "jwks_uri": format!("{issuer}/jwks"),
        })))
        .mount(server)
        .await;
    let set = JwkSet {
        keys: keys.iter().map(|signer| signer.jwk.clone()).collect(),
    };
    Mock::given(method("GET"))
        .and(path("/jwks"))
        .respond_with(ResponseTemplate::new(200).set_body_json(set))
        .mount(server)
        .await;
}

fn options(issuer: &str) -> IdentityOptions {
    IdentityOptions {
        issuers: vec![IssuerOptions {
            issuer: issuer.to_owned(),
            audiences: vec![AUDIENCE.to_owned()],
            jwks_url: None,
            algorithms: vec![Algorithm::ES256, Algorithm::RS256],
            tenant_claim: Some("tenant".into()),
            tenant: None,
            tenants: Vec::new(),
            person_claim: "sub".into(),
            role_claims: vec!["roles".into()],
            roles: std::collections::BTreeMap::new(),
        }],
        keys_refetch_interval: Duration::from_secs(3600),
        keys_timeout: Duration::from_millis(500),
        ..IdentityOptions::default()
    }
}

fn claims(issuer: &str) -> Value {
    json!({
        "iss": issuer, "aud": AUDIENCE, "sub": "ana", "tenant": "search",
        "roles": ["approver"], "exp": now() + 300, "iat": now(),
    })
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

/// A token of `header` and `claims` with `signature`, as base64url.
fn forged(header: &Value, claims: &Value, signature: &[u8]) -> String {
    let part = |bytes: &[u8]| data_encoding::BASE64URL_NOPAD.encode(bytes);
    format!(
        "{}.{}.{}",
        part(header.to_string().as_bytes()),
        part(claims.to_string().as_bytes()),
        part(signature)
    )
}

#[tokio::test]
async fn a_token_of_a_trusted_issuer_is_its_tenant_person_and_roles() {
    let server = MockServer::start().await;
    let signer = Signer::new("k1");
    serve(&server, &[&signer]).await;
    let issuers = Issuers::new(&options(&server.uri())).unwrap().unwrap();
    let identity = issuers
        .verify(&signer.sign(&claims(&server.uri())), Door::Api)
        .await
        .unwrap();
    assert_eq!(
        identity,
        Identity {
            tenant: "search".into(),
            person: "ana".into(),
            roles: crate::auth::Roles::of(&[crate::auth::Role::Approver]),
        }
    );
    // Within the clock skew (60 s), a token just expired still is.
    let late = with(claims(&server.uri()), "exp", json!(now() - 30));
    assert!(issuers.verify(&signer.sign(&late), Door::Api).await.is_ok());
}

#[tokio::test]
async fn every_hostile_token_is_refused_by_the_check_it_fails() {
    let server = MockServer::start().await;
    let signer = Signer::new("k1");
    serve(&server, &[&signer]).await;
    let issuer = server.uri();
    let issuers = Issuers::new(&options(&issuer)).unwrap().unwrap();
    let good = claims(&issuer);
    let stranger = Signer::new("k1");
    let signed = signer.sign(&good);
    let (head, _) = signed.split_once('.').unwrap();
    let tampered = {
        let parts: Vec<&str> = signed.split('.').collect();
        let other = signer.sign(&with(good.clone(), "tenant", json!("ads")));
        let payload = other.split('.').nth(1).unwrap().to_owned();
        format!("{}.{payload}.{}", parts[0], parts[2])
    };
    // HMAC with the issuer's public key as the secret: the classic
    // confusion; HS256 is never an accepted algorithm.
    let public = serde_json::to_vec(&signer.jwk).unwrap();
    let confused = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &good,
        &EncodingKey::from_secret(&public).unwrap(),
    )
    .unwrap();
    let cases: Vec<(String, Refusal)> = vec![
        (
            signer.sign(&with(good.clone(), "exp", json!(now() - 600))),
            Refusal::Expired,
        ),
        (
            signer.sign(&with(good.clone(), "nbf", json!(now() + 600))),
            Refusal::NotYetValid,
        ),
        (
            signer.sign(&with(good.clone(), "aud", json!("another-api"))),
            Refusal::Audience,
        ),
        (
            signer.sign(&with(good.clone(), "iss", json!("https://evil.example"))),
            Refusal::UnknownIssuer,
        ),
        (
            forged(&json!({"alg": "none", "kid": "k1"}), &good, b""),
            Refusal::Malformed("header"),
        ),
        (confused, Refusal::Algorithm),
        (
            stranger_with_kid(&stranger, "k2", &good),
            Refusal::UnknownKey,
        ),
        (stranger.sign(&good), Refusal::Signature),
        (tampered, Refusal::Signature),
        (
            {
                let mut claims = good.clone();
                claims.as_object_mut().unwrap().remove("exp");
                signer.sign(&claims)
            },
            Refusal::Claim {
                claim: "exp".into(),
                why: "is missing or not of its type",
            },
        ),
        ("not.a.jwt".into(), Refusal::Malformed("header")),
        (format!("{head}.%%%.x"), Refusal::Malformed("claims")),
        (
            signer.sign(&with(good.clone(), "roles", json!(["admin"]))),
            Refusal::NoRole {
                claims: "roles".into(),
            },
        ),
    ];
    for (token, expected) in cases {
        let refusal = issuers.verify(&token, Door::Api).await.unwrap_err();
        assert_eq!(refusal, expected, "{token}");
        let said = refusal.to_string();
        assert!(!said.contains(&token) && !said.contains("ana"), "{said}");
    }
}

fn stranger_with_kid(signer: &Signer, kid: &str, claims: &Value) -> String {
    let mut header = Header::new(Algorithm::ES256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &signer.key).unwrap()
}

#[tokio::test]
async fn a_gateway_passes_on_only_the_tokens_minted_for_it() {
    let server = MockServer::start().await;
    let signer = Signer::new("k1");
    serve(&server, &[&signer]).await;
    let issuers = Issuers::new(&options(&server.uri())).unwrap().unwrap();
    let gateway = "https://mcp.example/mcp";
    let for_gateway = signer.sign(&with(claims(&server.uri()), "aud", json!([gateway])));
    let for_api = signer.sign(&claims(&server.uri()));
    for (token, door, expected) in [
        (&for_gateway, Door::Gateway(Some(gateway)), None),
        (&for_api, Door::Api, None),
        (&for_gateway, Door::Api, Some(Refusal::Audience)),
        (
            &for_api,
            Door::Gateway(Some(gateway)),
            Some(Refusal::GatewayAudience),
        ),
        (
            &for_gateway,
            Door::Gateway(Some("https://other.example/mcp")),
            Some(Refusal::GatewayAudience),
        ),
        (
            &for_api,
            Door::Gateway(None),
            Some(Refusal::GatewayAudience),
        ),
    ] {
        let verified = issuers.verify(token, door).await;
        assert_eq!(verified.err(), expected, "{door:?}");
    }
}

#[tokio::test]
async fn a_new_key_is_picked_up_and_a_flood_of_unknown_ids_fetches_once() {
    let server = MockServer::start().await;
    let (old, new) = (Signer::new("old"), Signer::new("new"));
    serve(&server, &[&old]).await;
    let issuer = server.uri();
    let mut options = options(&issuer);
    options.keys_refetch_interval = Duration::from_millis(300);
    let issuers = Issuers::new(&options).unwrap().unwrap();
    assert!(
        issuers
            .verify(&old.sign(&claims(&issuer)), Door::Api)
            .await
            .is_ok()
    );
    // The provider rotates: a token of the new key waits out the least
    // interval, then one fetch finds it, without a restart.
    serve(&server, &[&old, &new]).await;
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(
        issuers
            .verify(&new.sign(&claims(&issuer)), Door::Api)
            .await
            .is_ok()
    );
    let fetches = |requests: Vec<wiremock::Request>| {
        requests.iter().filter(|r| r.url.path() == "/jwks").count()
    };
    assert_eq!(fetches(server.received_requests().await.unwrap()), 1);
    // A flood of tokens naming keys nobody has: at most one more fetch.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let stranger = Signer::new("x");
    let flood = (0..200).map(|n| {
        let token = stranger_with_kid(&stranger, &format!("kid-{n}"), &claims(&issuer));
        let issuers = &issuers;
        async move { issuers.verify(&token, Door::Api).await }
    });
    for refusal in futures::future::join_all(flood).await {
        assert_eq!(refusal.unwrap_err(), Refusal::UnknownKey);
    }
    let after = fetches(server.received_requests().await.unwrap());
    assert!(
        after <= 2,
        "{after} fetches of the JWKS for 200 unknown kids"
    );
}

#[tokio::test]
async fn keys_that_are_down_slow_or_huge_let_no_token_in() {
    let signer = Signer::new("k1");
    for response in [
        ResponseTemplate::new(503),
        ResponseTemplate::new(200)
            .set_body_json(json!({"keys": []}))
            .set_delay(Duration::from_secs(5)),
        ResponseTemplate::new(200)
            .set_body_string(format!("{{\"keys\": [\"{}\"]}}", "x".repeat(300 * 1024))),
        ResponseTemplate::new(200).set_body_string("not json"),
        ResponseTemplate::new(200).set_body_json(json!({"keys": [
            {"kty": "oct", "kid": "k1", "k": "c2VjcmV0"}
        ]})),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path("/jwks"))
            .respond_with(response)
            .mount(&server)
            .await;
        let issuer = server.uri();
        let mut options = options(&issuer);
        options.issuers[0].jwks_url = Some(format!("{issuer}/jwks"));
        let issuers = Issuers::new(&options).unwrap().unwrap();
        let started = std::time::Instant::now();
        let refusal = issuers
            .verify(&signer.sign(&claims(&issuer)), Door::Api)
            .await
            .unwrap_err();
        assert_eq!(refusal, Refusal::KeysUnavailable);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "bounded by keys_timeout"
        );
    }
}

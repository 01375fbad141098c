package kafka_txn_sink.testbed;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.time.format.DateTimeParseException;
import java.util.Base64;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.StringJoiner;
import java.util.TreeMap;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import javax.security.auth.callback.Callback;
import javax.security.auth.callback.UnsupportedCallbackException;
import javax.security.auth.login.AppConfigurationEntry;
import org.apache.kafka.common.security.auth.AuthenticateCallbackHandler;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerExtensionsValidatorCallback;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerToken;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerTokenCallback;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallback;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The test bed's stand-in for AWS MSK's IAM check: an OAUTHBEARER server callback handler that
 * accepts the token of AWS's signers (a base64url SigV4-presigned URL of
 * {@code kafka-cluster:Connect}) when its access key id is listed, its signature is right and it
 * is live. It is the listener's login callback handler too, giving the broker no token.
 *
 * <p>JAAS options: {@code credentialsFile} (lines {@code akid=secret[,principal]}, read again on
 * every login so that keys can be added and revoked while the broker runs), {@code region},
 * {@code maxSkewSeconds} (default 300) and {@code maxTokenAgeSeconds} (default: the token's own
 * {@code X-Amz-Expires}). Each login logs one line, {@code MskIamValidator: accepted <principal>
 * signed at <X-Amz-Date>} or {@code MskIamValidator: refused: <reason>}; never a secret, a
 * signature or a session token.
 */
public final class MskIamValidator implements AuthenticateCallbackHandler {
    private static final Logger LOG = LoggerFactory.getLogger(MskIamValidator.class);
    private static final String ALGORITHM = "AWS4-HMAC-SHA256";
    private static final String SERVICE = "kafka-cluster";
    private static final String ACTION = "kafka-cluster:Connect";
    private static final long MAX_EXPIRES_S = 900;
    private static final DateTimeFormatter AMZ_DATE =
            DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'").withZone(ZoneOffset.UTC);
    // Neither signed nor part of the canonical query: the signature itself, and the signer's
    // name that AWS's libraries append after signing.
    private static final Set<String> UNSIGNED = Set.of("X-Amz-Signature", "User-Agent");

    private Path credentialsFile;
    private String region;
    private long maxSkewS;
    private long maxTokenAgeS;

    @Override
    public void configure(
            Map<String, ?> configs, String saslMechanism, List<AppConfigurationEntry> jaas) {
        if (!"OAUTHBEARER".equals(saslMechanism) || jaas.size() != 1) {
            throw new IllegalArgumentException("MskIamValidator: OAUTHBEARER, one JAAS entry");
        }
        Map<String, ?> options = jaas.get(0).getOptions();
        credentialsFile = Path.of(option(options, "credentialsFile", null));
        region = option(options, "region", null);
        maxSkewS = Long.parseLong(option(options, "maxSkewSeconds", "300"));
        maxTokenAgeS = Long.parseLong(option(options, "maxTokenAgeSeconds", "" + MAX_EXPIRES_S));
    }

    private static String option(Map<String, ?> options, String name, String fallback) {
        Object value = options.get(name);
        if (value == null && fallback == null) {
            throw new IllegalArgumentException("MskIamValidator needs the JAAS option " + name);
        }
        return value == null ? fallback : value.toString();
    }

    @Override
    public void handle(Callback[] callbacks) throws UnsupportedCallbackException {
        for (Callback callback : callbacks) {
            if (callback instanceof OAuthBearerValidatorCallback validation) {
                validate(validation);
            } else if (!(callback instanceof OAuthBearerExtensionsValidatorCallback)
                    && !(callback instanceof OAuthBearerTokenCallback)) {
                // Extensions are answered by validating none: MSK's tokens carry none. A token
                // is answered with none: as the listener's login handler, this lets the broker
                // log in without one (it never connects to this listener as a client), where
                // Kafka's default handler would try to build one from the options above.
                throw new UnsupportedCallbackException(callback);
            }
        }
    }

    @Override
    public void close() {}

    private void validate(OAuthBearerValidatorCallback callback) {
        try {
            IamToken token = check(callback.tokenValue(), Instant.now());
            callback.token(token);
            LOG.info("MskIamValidator: accepted {} signed at {}", token.principalName(),
                    AMZ_DATE.format(Instant.ofEpochMilli(token.startTimeMs())));
        } catch (Refused refused) {
            LOG.warn("MskIamValidator: refused: {}", refused.getMessage());
            callback.error("invalid_token", null, null);
        }
    }

    private IamToken check(String token, Instant now) throws Refused {
        URI url = signedUrl(token);
        Map<String, String> query = queryParameters(url);
        String host = "kafka." + region + ".amazonaws.com";
        require("https".equals(url.getScheme()) && host.equals(url.getHost())
                && url.getPort() == -1 && url.getRawUserInfo() == null
                && "/".equals(url.getRawPath()) && url.getRawFragment() == null,
                "not a URL of https://" + host + "/");
        require(ACTION.equals(query.get("Action")), "Action is not " + ACTION);
        require(ALGORITHM.equals(query.get("X-Amz-Algorithm")), "algorithm is not " + ALGORITHM);
        require("host".equals(query.get("X-Amz-SignedHeaders")), "signed headers are not host");
        String date = parameter(query, "X-Amz-Date");
        Instant signedAt = signingTime(date);
        String[] credential = parameter(query, "X-Amz-Credential").split("/", -1);
        require(credential.length == 5 && credential[1].equals(date.substring(0, 8))
                && credential[2].equals(region) && credential[3].equals(SERVICE)
                && credential[4].equals("aws4_request"),
                "credential scope is not <date>/" + region + "/" + SERVICE + "/aws4_request");
        long expiresS = expires(parameter(query, "X-Amz-Expires"));
        Listed listed = lookUp(credential[0]);
        require(signatureMatches(url, query, credential, listed.secret()),
                "the signature of " + credential[0] + " does not match");
        Instant end = signedAt.plusSeconds(Math.min(expiresS, maxTokenAgeS));
        require(!now.isBefore(signedAt.minusSeconds(maxSkewS)), "signed in the future: " + date);
        require(now.isBefore(end), "expired: signed at " + date + ", valid until " + end);
        return new IamToken(token, Set.of(), end.toEpochMilli(), listed.principal(),
                signedAt.toEpochMilli());
    }

    private static URI signedUrl(String token) throws Refused {
        try {
            byte[] url = Base64.getUrlDecoder().decode(token);
            return new URI(new String(url, StandardCharsets.UTF_8));
        } catch (IllegalArgumentException | URISyntaxException e) {
            throw new Refused("not a base64url-encoded URL");
        }
    }

    private static Map<String, String> queryParameters(URI url) throws Refused {
        require(url.getRawQuery() != null, "the URL has no query");
        Map<String, String> query = new HashMap<>();
        for (String pair : url.getRawQuery().split("&", -1)) {
            String[] kv = pair.split("=", 2);
            require(kv.length == 2, "a query parameter without a value");
            String key = urlDecoded(kv[0]);
            require(query.put(key, urlDecoded(kv[1])) == null, "parameter " + key + " is repeated");
        }
        return query;
    }

    private static String urlDecoded(String text) throws Refused {
        try {
            return URLDecoder.decode(text, StandardCharsets.UTF_8);
        } catch (IllegalArgumentException e) {
            throw new Refused("a query parameter is not URL-encoded");
        }
    }

    private static String parameter(Map<String, String> query, String name) throws Refused {
        String value = query.get(name);
        require(value != null, "no " + name);
        return value;
    }

    private static Instant signingTime(String date) throws Refused {
        try {
            return Instant.from(AMZ_DATE.parse(date));
        } catch (DateTimeParseException e) {
            throw new Refused("X-Amz-Date is not yyyyMMddTHHmmssZ");
        }
    }

    private static long expires(String value) throws Refused {
        try {
            long seconds = Long.parseLong(value);
            require(seconds > 0 && seconds <= MAX_EXPIRES_S, "X-Amz-Expires is not 1 to 900");
            return seconds;
        } catch (NumberFormatException e) {
            throw new Refused("X-Amz-Expires is not a number");
        }
    }

    private record Listed(String secret, String principal) {}

    private Listed lookUp(String accessKeyId) throws Refused {
        List<String> lines;
        try {
            lines = Files.readAllLines(credentialsFile, StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new Refused("cannot read " + credentialsFile + ": " + e.getClass().getName());
        }
        for (String line : lines) {
            String[] entry = line.strip().split("=", 2);
            if (entry.length == 2 && entry[0].equals(accessKeyId)) {
                String[] secretAndPrincipal = entry[1].split(",", 2);
                String principal =
                        secretAndPrincipal.length == 2 ? secretAndPrincipal[1] : accessKeyId;
                return new Listed(secretAndPrincipal[0], principal);
            }
        }
        throw new Refused("unknown access key id " + accessKeyId);
    }

    /** SigV4 of a presigned GET with {@code host} as the only signed header. */
    private static boolean signatureMatches(
            URI url, Map<String, String> query, String[] credential, String secret) {
        TreeMap<String, String> canonical = new TreeMap<>();
        query.forEach((key, value) -> {
            if (!UNSIGNED.contains(key)) {
                canonical.put(encode(key), encode(value));
            }
        });
        StringJoiner canonicalQuery = new StringJoiner("&");
        canonical.forEach((key, value) -> canonicalQuery.add(key + "=" + value));
        String request = String.join("\n", "GET", "/", canonicalQuery.toString(),
                "host:" + url.getHost() + "\n", "host", sha256Hex(""));
        String scope = String.join("/", credential[1], credential[2], credential[3], credential[4]);
        String toSign = String.join("\n", ALGORITHM, query.get("X-Amz-Date"), scope,
                sha256Hex(request));
        byte[] key = ("AWS4" + secret).getBytes(StandardCharsets.UTF_8);
        for (int i = 1; i < credential.length; i++) {
            key = hmac(key, credential[i]);
        }
        String expected = HexFormat.of().formatHex(hmac(key, toSign));
        String given = query.get("X-Amz-Signature");
        return given != null && MessageDigest.isEqual(
                expected.getBytes(StandardCharsets.UTF_8), given.getBytes(StandardCharsets.UTF_8));
    }

    /** RFC 3986: everything but A-Z a-z 0-9 - _ . ~ percent-encoded, as SigV4 wants. */
    private static String encode(String text) {
        StringBuilder out = new StringBuilder();
        for (byte b : text.getBytes(StandardCharsets.UTF_8)) {
            int c = b & 0xff;
            boolean unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
                    || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~';
            out.append(unreserved ? String.valueOf((char) c) : String.format("%%%02X", c));
        }
        return out.toString();
    }

    private static byte[] hmac(byte[] key, String message) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(key, "HmacSHA256"));
            return mac.doFinal(message.getBytes(StandardCharsets.UTF_8));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("no HmacSHA256 in this JVM", e);
        }
    }

    private static String sha256Hex(String text) {
        try {
            MessageDigest digest = MessageDigest.getInstance("SHA-256");
            return HexFormat.of().formatHex(digest.digest(text.getBytes(StandardCharsets.UTF_8)));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("no SHA-256 in this JVM", e);
        }
    }

    private static void require(boolean condition, String reason) throws Refused {
        if (!condition) {
            throw new Refused(reason);
        }
    }

    /** A token refused, and why (never a secret, a signature or a session token). */
    private static final class Refused extends Exception {
        private static final long serialVersionUID = 1L;

        Refused(String reason) {
            super(reason, null, false, false);
        }
    }

    /** The accepted token as Kafka sees it; its value (the whole token) is kept out of logs. */
    private record IamToken(String value, Set<String> scope, long lifetimeMs,
            String principalName, Long startTimeMs) implements OAuthBearerToken {
        @Override
        public String toString() {
            return "IamToken[principal=" + principalName + ", lifetimeMs=" + lifetimeMs + "]";
        }
    }
}

import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.*;
import java.time.format.DateTimeFormatter;
import java.util.*;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallback;

// Prototype only: checks one MSK IAM OAUTHBEARER token (args: token, accessKeyId, secret).
public class Verify {
    static byte[] hmac(byte[] key, String msg) throws Exception {
        Mac mac = Mac.getInstance("HmacSHA256");
        mac.init(new SecretKeySpec(key, "HmacSHA256"));
        return mac.doFinal(msg.getBytes(StandardCharsets.UTF_8));
    }
    static String hex(byte[] b) { return HexFormat.of().formatHex(b); }
    static String sha256(String s) throws Exception {
        return hex(MessageDigest.getInstance("SHA-256").digest(s.getBytes(StandardCharsets.UTF_8)));
    }
    static String enc(String s) { // RFC 3986, unreserved A-Za-z0-9-_.~
        StringBuilder out = new StringBuilder();
        for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
            int c = b & 0xff;
            if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~') out.append((char) c);
            else out.append(String.format("%%%02X", c));
        }
        return out.toString();
    }
    public static void main(String[] a) throws Exception {
        new OAuthBearerValidatorCallback(a[0]); // API present in this kafka-clients
        String url = new String(Base64.getUrlDecoder().decode(a[0]), StandardCharsets.UTF_8);
        java.net.URI uri = java.net.URI.create(url);
        Map<String, String> q = new TreeMap<>();
        for (String pair : uri.getRawQuery().split("&")) {
            String[] kv = pair.split("=", 2);
            q.put(URLDecoder.decode(kv[0], StandardCharsets.UTF_8), URLDecoder.decode(kv[1], StandardCharsets.UTF_8));
        }
        String signature = q.remove("X-Amz-Signature"); q.remove("User-Agent");
        TreeMap<String, String> canon = new TreeMap<>();
        q.forEach((k, v) -> canon.put(enc(k), enc(v)));
        StringJoiner cq = new StringJoiner("&");
        canon.forEach((k, v) -> cq.add(k + "=" + v));
        String creq = String.join("\n", "GET", "/", cq.toString(), "host:" + uri.getHost() + "\n", "host", sha256(""));
        String[] cred = q.get("X-Amz-Credential").split("/"); // AKID/date/region/service/aws4_request
        String scope = String.join("/", Arrays.copyOfRange(cred, 1, 5));
        String sts = String.join("\n", "AWS4-HMAC-SHA256", q.get("X-Amz-Date"), scope, sha256(creq));
        byte[] key = ("AWS4" + a[2]).getBytes(StandardCharsets.UTF_8);
        for (int i = 1; i < 5; i++) key = hmac(key, cred[i]);
        boolean sigOk = MessageDigest.isEqual(hex(hmac(key, sts)).getBytes(), signature.getBytes());
        Instant signed = LocalDateTime.parse(q.get("X-Amz-Date"), DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'")).toInstant(ZoneOffset.UTC);
        Instant expires = signed.plusSeconds(Long.parseLong(q.get("X-Amz-Expires")));
        System.out.println("sig=" + sigOk + " akid=" + cred[0].equals(a[1]) + " action=" + q.get("Action")
            + " host=" + uri.getHost() + " region=" + cred[2] + " service=" + cred[3]
            + " live=" + Instant.now().isBefore(expires) + " lifetimeMs=" + expires.toEpochMilli());
    }
}

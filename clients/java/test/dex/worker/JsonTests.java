package dex.worker;

import static dex.worker.Dex.check;

import java.math.BigInteger;
import java.util.List;
import java.util.Map;

/** The JSON reader and writer alone (no server). */
final class JsonTests {
    private JsonTests() {}

    static void register(Map<String, TestMain.Check> tests) {
        tests.put("jsonRoundTripsWhatJavaHolds", JsonTests::roundTrips);
        tests.put("jsonRefusesWhatIsNotStrictJson", JsonTests::refuses);
    }

    static void roundTrips() {
        Object value = Json.parse("{\"a\": [1, -2.5, 9007199254740993, 123456789012345678901234567890, true, null],"
                + " \"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0000\\u00e9\\ud83d\\ude00\\ud800\"}");
        Map<?, ?> map = (Map<?, ?>) value;
        List<?> items = (List<?>) map.get("a");
        check(items.get(0).equals(1L) && items.get(1).equals(-2.5) && items.get(2).equals(9007199254740993L)
                && items.get(3).equals(new BigInteger("123456789012345678901234567890")) && items.get(5) == null,
                "numbers keep their kind and digits: " + items);
        check(Json.write(map.get("a")).equals("[1,-2.5,9007199254740993,123456789012345678901234567890,true,null]"),
                Json.write(map.get("a")));
        String text = (String) map.get("s");
        check(text.equals("q\"\\/\b\f\n\r\t\u0000\u00e9\ud83d\ude00\ud800"), "decoded " + text);
        check(Json.write(text).equals("\"q\\\"\\\\/\\u0008\\u000c\\n\\r\\t\\u0000\\u00e9\\ud83d\\ude00\\ud800\""),
                Json.write(text));
        check(Json.parse(Json.write(value)).equals(value), "a written value reads back the same");
    }

    static void refuses() {
        for (String bad : new String[] {"NaN", "[1,]", "{\"a\":1,}", "01", "1.", "\"a", "[1] x", "1e999", "\"\t\"", "{1: 2}", ""}) {
            try {
                Json.parse(bad);
                throw new AssertionError("accepted " + bad);
            } catch (IllegalArgumentException expected) {
                // refused, as it should be
            }
        }
        try {
            Json.parse("[".repeat(600) + "]".repeat(600));
            throw new AssertionError("accepted 600 levels");
        } catch (IllegalArgumentException expected) {
            // refused
        }
        for (Object bad : new Object[] {Double.NaN, Double.POSITIVE_INFINITY, new Object(), Map.of(1, 2)}) {
            try {
                Json.write(bad);
                throw new AssertionError("wrote " + bad);
            } catch (IllegalArgumentException expected) {
                // no JSON form
            }
        }
    }
}

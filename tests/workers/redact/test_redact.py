"""The redaction contract on transcripts rows shaped as the Whisper worker writes them (the
spellings below are tiny.en's, seen on synthesized calls); the real model end to end is
tests/workers/redact/test_redaction_corpus.py."""

from __future__ import annotations

import pytest

from overnight.workers.redact import TYPES, RedactionConfigError, Redactor, resolve_types
from overnight.workers.redact.numbers import text_digits


def row(*turns: tuple[str | None, str]) -> dict:
    """A transcripts row: one segment a turn, words 0.5 s apart (recording time)."""
    segments, t = [], 0.0
    for speaker, text in turns:
        words = []
        for w in text.split():
            words.append({"word": w, "start": t, "end": t + 0.4, "probability": 0.9})
            t += 0.5
        segments.append(
            {
                "start": words[0]["start"],
                "end": words[-1]["end"],
                "text": text,
                "channel": 0 if speaker in (None, "agent") else 1,
                "speaker": speaker,
                "words": words,
            }
        )
        t += 1.0
    split = any(s for s, _ in turns)
    text = "\n".join(f"{s}: {x}" for s, x in turns) if split else " ".join(x for _, x in turns)
    return {"text": text, "segments": segments}


def words_of(fields: dict) -> list[str]:
    return [w["word"] for s in fields["segments"] for w in s["words"]]


def test_presets_expand_and_unknown_types_name_the_known_ones():
    assert resolve_types(["pci"]) == ("card_number", "cvv", "expiry", "bank_account")
    assert resolve_types(["all"]) == TYPES
    assert resolve_types(["SSN", "card-number"]) == ("card_number", "ssn")
    with pytest.raises(RedactionConfigError, match="known types: card_number, cvv"):
        Redactor(["card_number", "passport"])


def test_card_number_written_as_thousands_groups_becomes_one_tag_in_text_segments_and_words():
    r = row((None, "My card number is 4,111,111,111,111,111,111,111 and it expires 09/27."))
    fields, entities = Redactor(["pci"]).redact(r)
    assert fields["text"] == "My card number is [CARD_NUMBER] and it expires [EXPIRY]."
    assert fields["segments"][0]["text"] == fields["text"]
    assert words_of(fields) == [
        "My",
        "card",
        "number",
        "is",
        "[CARD_NUMBER]",
        "and",
        "it",
        "expires",
        "[EXPIRY]",
    ]
    card = entities[0]
    assert card["type"] == "card_number"
    assert r["text"][card["start_char"] : card["end_char"]] == "4,111,111,111,111,111,111,111"
    assert (card["start_s"], card["end_s"]) == (2.0, 2.4)
    tag_word = fields["segments"][0]["words"][4]
    assert (tag_word["start"], tag_word["end"]) == (2.0, 2.4)


def test_spelled_out_digits_with_oh_and_double_are_one_card_number():
    r = row((None, "the card is four one double one, one one oh one, 1 1 1 1, one one one one"))
    fields, entities = Redactor(["card_number"]).redact(r)
    assert fields["text"] == "the card is [CARD_NUMBER]"
    assert [e["type"] for e in entities] == ["card_number"]


def test_number_over_two_turns_of_the_customer_is_tagged_in_both_turns_only():
    r = row(
        ("agent", "What is the card number?"),
        ("customer", "It is 4111 1111"),
        ("agent", "Okay, go on."),
        ("customer", "1111 1111."),
    )
    fields, entities = Redactor(["card_number"]).redact(r)
    assert fields["text"] == (
        "agent: What is the card number?\ncustomer: It is [CARD_NUMBER]\n"
        "agent: Okay, go on.\ncustomer: [CARD_NUMBER]."
    )
    assert len(entities) == 1 and entities[0]["end_s"] > entities[0]["start_s"] + 3


def test_the_rest_of_a_card_after_words_whisper_made_of_its_digits_is_the_card():
    r = row(
        ("agent", "Sure, what is the card number?"),
        ("customer", "It's in 5759 3336 9800"),
        ("agent", "Okay, go on."),
        ("customer", "I hate Nero Nero 2 5 2 1"),
        ("agent", "And the other card number?"),
        ("customer", "It's in 4643 1515 1538-eight forty-five, zero-five-eight two."),
        ("agent", "And the last one?"),
        ("customer", "It's in 4 6 4 3 1 5 1 5 Thirty -eight forty -five, zero -five -eight two."),
    )
    fields, entities = Redactor(["card_number"]).redact(r)
    assert "customer: I hate Nero Nero [CARD_NUMBER]\n" in fields["text"]
    # "forty-five" is two digits: the card goes on to its last group.
    assert "customer: It's in [CARD_NUMBER].\n" in fields["text"]
    # Whisper's words "Thirty", "-eight": 38.
    assert fields["text"].endswith("customer: It's in [CARD_NUMBER].")
    assert [e["type"] for e in entities] == ["card_number"] * 4


def test_twelve_digits_are_a_card_whatever_their_luhn_check_and_eight_only_after_a_card_cue():
    valid, invalid = "4111 1111 1111 1111", "4111 1111 1111 1112"
    redactor = Redactor(["card_number"])
    assert redactor.redact(row((None, f"the reference is {valid}")))[1]
    assert redactor.redact(row((None, f"the reference is {invalid}")))[1]
    assert redactor.redact(row((None, f"my visa is {invalid}")))[1]
    assert redactor.redact(row((None, "my visa is 4111 1112, okay")))[1]
    assert not redactor.redact(row((None, "the reference is 4111 1112, okay")))[1]


def test_the_few_digits_whisper_kept_of_a_card_read_out_after_card_number_are_the_card():
    # tiny.en on a 16-digit reading: "The card number is 4936." (seed 19 of the corpus)
    redactor = Redactor(["card_number"])
    fields, entities = redactor.redact(row(("customer", "The card number is 4936.")))
    assert [e["type"] for e in entities] == ["card_number"] and "4936" not in fields["text"]
    # a card word near a number is not enough: a balance, an order of card games
    for said in ("Your gift card balance is 2500 dollars.", "I ordered 4936 card games."):
        assert not redactor.redact(row(("customer", said)))[1], said


def test_an_address_given_after_i_live_at_is_redacted_when_whisper_mishears_its_street_type():
    redactor = Redactor(["address"])
    fields, entities = redactor.redact(row(("customer", "I live at 42 Lincoln driving Boston.")))
    assert [e["type"] for e in entities] == ["address"]
    assert "Lincoln" not in fields["text"] and "Boston" not in fields["text"]
    for said in ("We moved 3 boxes yesterday.", "I live at home with 2 cats."):
        assert not redactor.redact(row(("customer", said)))[1], said


def test_security_code_heard_as_words_after_security_code_in_is_the_cvv():
    r = row(
        ("agent", "And the security code on the back?"),
        ("customer", "The security code in free free."),
    )
    fields, entities = Redactor(["cvv"]).redact(r)
    assert fields["text"].endswith("customer: The security code in [CVV].")
    assert [e["type"] for e in entities] == ["cvv"]


def test_an_email_ending_the_sentence_and_an_ssn_heard_as_short_runs_or_glued_to_a_word():
    r = row(
        ("agent", "To verify your identity, what is your social security number?"),
        ("customer", "My social is 515 for Nero, Nero 112."),
        ("agent", "And again, what is your social security number?"),
        ("customer", "My social import i0217940"),
        ("agent", "Can I have your email for the receipt?"),
        ("customer", "Sure, my email is beta dot miller at email dot com."),
    )
    fields, entities = Redactor(["ssn", "email"]).redact(r)
    assert "customer: My social is [SSN]." in fields["text"]
    assert "customer: My social import [SSN]" in fields["text"]
    assert "customer: Sure, my email is [EMAIL]." in fields["text"]
    assert [e["type"] for e in entities] == ["ssn", "ssn", "email"]


def test_an_address_whose_house_number_whisper_lost_is_redacted_up_to_its_city():
    redactor = Redactor(["address"])
    fields, entities = redactor.redact(
        row(("customer", "I live at I -T -Wanno Avenue in Seattle."))
    )
    assert fields["text"] == "customer: I live at [ADDRESS]."
    fields, _ = redactor.redact(row(("customer", "I live at I .D. Lincoln Avenue in Portland.")))
    assert fields["text"] == "customer: I live at [ADDRESS]."
    assert [e["type"] for e in entities] == ["address"]
    for said in ("I live at the end of the road.", "The address is on the way out."):
        assert not redactor.redact(row(("customer", said)))[1], said
    # Asked for it, the rest of the sentence is the address, whatever Whisper made of it.
    asked = row(
        ("agent", "What is the address on the account?"),
        ("customer", "I live at United States, Washington, driving Portland. Thanks."),
    )
    assert redactor.redact(asked)[0]["text"].endswith("customer: I live at [ADDRESS]. Thanks.")


def test_ssn_phone_email_cvv_and_expiry_as_whisper_writes_them():
    r = row(
        (
            None,
            "My social security number is 123-45-6,780 and you can reach me at "
            "450-555-0132 or at jon.mit at mampl.com. The security code is 1 2 3 and it "
            "expires oh nine twenty seven.",
        )
    )
    fields, entities = Redactor(["all"]).redact(r)
    assert fields["text"] == (
        "My social security number is [SSN] and you can reach me at [PHONE] or at [EMAIL]. "
        "The security code is [CVV] and it expires [EXPIRY]."
    )
    assert [e["type"] for e in entities] == ["ssn", "phone", "email", "cvv", "expiry"]


def test_expiry_after_whisper_hears_expiration_date_as_exploration_made():
    """tiny.en on the synthesized calls: "and the expiration date" → "and the exploration
    made", "it expires oh four twenty eight" → "It takes 5 0 4 28", "expired" for expires;
    "may" the verb is not the month."""
    cases = [
        ("It takes 5 0 4 28.", "It takes [EXPIRY]."),
        ("It expired March 2013.", "It expired [EXPIRY]."),
        ("The expiration may be April 2026.", "The expiration may be [EXPIRY]."),
    ]
    for said, redacted in cases:
        r = row(("agent", "and the exploration made."), ("customer", said))
        fields, entities = Redactor(["pci"]).redact(r)
        assert fields["text"] == f"agent: and the exploration made.\ncustomer: {redacted}"
        assert [e["type"] for e in entities] == ["expiry"]


def test_names_addresses_and_dates_of_birth_from_cue_phrases():
    r = row(
        (
            None,
            "Hi, this is Sarah from billing. My name is Maria Lopez and I live at 42 Oak "
            "Street, Springfield. My date of birth is March 3rd, 1985.",
        )
    )
    fields, _ = Redactor(["person", "address", "date_of_birth"]).redact(r)
    assert fields["text"] == (
        "Hi, this is [PERSON] from billing. My name is [PERSON] and I live at [ADDRESS]. "
        "My date of birth is [DATE_OF_BIRTH]."
    )


def test_ordinary_numbers_are_left_alone():
    text = (
        "I would like to order 3 boxes for 25 dollars each. Press one to continue. The store "
        "opens at 9:30 on Saturday, this is the billing department, your card ending in 4421."
    )
    fields, entities = Redactor(["all"]).redact(row((None, text)))
    assert entities == [] and fields["text"] == text


def test_only_the_chosen_types_are_redacted_and_the_row_is_not_changed():
    r = row((None, "My social is 123-45-6789 and my email is jon@example.com"))
    before = repr(r)
    fields, entities = Redactor(["email"]).redact(r)
    assert fields["text"] == "My social is 123-45-6789 and my email is [EMAIL]"
    assert [e["type"] for e in entities] == ["email"]
    assert repr(r) == before


def test_rows_without_words_redact_text_and_segments_with_segment_times():
    r = row((None, "my card number is 4111 1111 1111 1111"))
    for seg in r["segments"]:
        seg["words"] = None
    fields, entities = Redactor(["card_number"]).redact(r)
    assert fields["text"] == "my card number is [CARD_NUMBER]"
    assert fields["segments"][0]["words"] is None
    assert entities[0]["start_s"] == r["segments"][0]["start"]


def leaked(fields: dict, secret: str) -> set[str]:
    """The 4-digit pieces of ``secret`` a reader finds anywhere in the redacted row: its text,
    its segments' text and their words, numbers spoken or written."""
    said = [fields["text"] or ""]
    for seg in fields["segments"] or []:
        said.append(seg["text"] or "")
        said.append(" ".join(w["word"] for w in seg.get("words") or []))
    digits = [text_digits(t) for t in said]
    return {
        secret[i : i + 4]
        for i in range(len(secret) - 3)
        if any(secret[i : i + 4] in d for d in digits)
    }


@pytest.mark.parametrize(
    ("types", "said", "secret"),
    [
        # tiny.en's loop on a card read digit by digit, no cue, Luhn-invalid (issue #34)
        (["pci"], "It is time for 1-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3.", "5413333333333333"),
        # its loop of amounts on "219 09 9999" after "social security number"
        (
            ["ssn"],
            "My social security number is $200,000, " + "$10,000, " * 40,
            "200000100001000010000",
        ),
        (["all"], "My social security number is $200,000, " + "$10,000, " * 40, "2000001000010000"),
        # an account and routing number read in thousands
        (
            ["bank_account"],
            "The account number is zero zero one two four thousand five hundred sixty seven "
            "eight thousand nine hundred one and the routing number is zero two one zero zero "
            "zero zero two one.",
            "001245678901",
        ),
        (
            ["all"],
            "The account number is zero zero one two four thousand five hundred sixty seven "
            "eight thousand nine hundred one and the routing number is 021000021.",
            "021000021",
        ),
        # a perfect transcript: 16 digits, Luhn-invalid, no cue
        (["pci"], "It is 5413 3333 3333 3333.", "5413333333333333"),
        # a card read in thousands after a cue
        (
            ["pci"],
            "My card number is four thousand five hundred thirty nine, one thousand two hundred "
            "thirty four, five thousand six hundred seventy eight, nine thousand twelve.",
            "4539123456789012",
        ),
        (["pci"], "The card is 4,111,111, 1-1-1-1, 1111.", "41111111111111"),
        (["ssn"], "Social security. Two one nine, oh nine, nine nine nine nine.", "219099999"),
    ],
)
def test_numbers_as_whisper_garbles_them_leave_no_four_digits_of_the_secret(types, said, secret):
    fields, entities = Redactor(types).redact(row(("customer", said)))
    assert entities, said
    assert not leaked(fields, secret), (fields["text"], leaked(fields, secret))


def test_a_degenerate_segment_with_digits_is_redacted_from_its_first_digit_to_its_end():
    r = row(("customer", "Thank you."), ("customer", "Yes it is 42, 42, 17, 99, and so on"))
    r["segments"][1]["degenerate"] = True
    fields, entities = Redactor(["pci"]).redact(r)
    assert fields["segments"][0]["text"] == "Thank you."
    assert fields["segments"][1]["text"] == "Yes it is [BANK_ACCOUNT]"
    assert [e["type"] for e in entities] == ["bank_account"]
    # Its words are what was left of a loop: the tag, the entity and so the silenced audio
    # run to the segment's end, where the number may still be said.
    r["segments"][1]["end"] = 30.0
    fields, entities = Redactor(["pci"]).redact(r)
    assert fields["segments"][1]["words"][-1]["end"] == entities[0]["end_s"] == 30.0
    # not marked: four short numbers are nobody's secret
    r["segments"][1]["degenerate"] = False
    assert Redactor(["pci"]).redact(r)[1] == []


def test_amounts_quantities_times_and_menu_choices_stay_after_an_account_cue_too():
    for said in (
        "Your account balance is fifty dollars and twenty cents.",
        "The account was charged $49.99 twice.",
        "I have had this account for twelve years, press one to continue.",
        "We need four chairs and two tables at 9:30 on Saturday, order 3 boxes.",
    ):
        fields, entities = Redactor(["all"]).redact(row(("customer", said)))
        assert fields["text"] == f"customer: {said}" and not entities, (said, entities)


def test_a_card_read_with_dashes_and_a_misheard_word_between_digits_is_one_run():
    # tiny.en on "five four four nine ..." read with dashes, no card cue heard
    said = (
        "So I pass 4 dash 4 dash I, 2 dash 4 dash I, 7 dash, 7 dash 0 dash 4, 7 dash 7 dash I, "
        "7 dash I, 7 dash I."
    )
    fields, entities = Redactor(["pci"]).redact(row(("customer", said)))
    assert [e["type"] for e in entities] == ["card_number"]
    assert not leaked(fields, "442477047777")


def test_an_amount_whisper_wrote_without_its_sign_and_a_cards_last_four_stay():
    for said in (
        "The balance on the account is not a 3,175.94.",
        "The balance of the account is $320.47. Your card ending in 2801 is on file.",
    ):
        _, entities = Redactor(["all"]).redact(row(("agent", said)))
        assert not entities, (said, entities)


def test_digits_read_out_right_before_the_expiration_date_is_asked_for_are_the_card():
    # tiny.en lost "My visa is five two two zero ..." all but five of its digits
    r = row(
        ("agent", "Go ahead."),
        ("customer", "I need them in time to near or near or from in time 1, 1, 8, 6, 4."),
        ("agent", "And the expiration date?"),
    )
    fields, entities = Redactor(["pci"]).redact(r)
    assert [e["type"] for e in entities] == ["card_number"] and not leaked(fields, "11864")
    # Without a card's code asked for next, five digits are an order number.
    r = row(("agent", "Your order number is 1 1 8 6 4."), ("agent", "Anything else?"))
    assert Redactor(["pci"]).redact(r)[1] == []


def test_a_card_cue_reaches_twenty_words_and_a_day_is_no_street():
    far = "The gift card balance is $25.00. The upgrade cost $50.00 per month and we are meeting in a free mirror near a lot of new space today, your order number is 10 145346"
    assert Redactor(["all"]).redact(row(("agent", far)))[1] == []
    assert Redactor(["all"]).redact(row(("customer", "The meeting is at 5.51 Tuesday.")))[1] == []


def test_a_number_read_over_two_turns_is_masked_in_both_whatever_the_first_was_named():
    r = row(
        ("customer", "It is 5569 33118 levels."),
        ("agent", "Okay, go on."),
        (
            "customer",
            "Eight thousand two hundred and sixty seven seven thousand nine hundred and seventy two",
        ),
    )
    fields, entities = Redactor(["all"]).redact(r)
    assert entities and not leaked(fields, "5569331182677972")
    # the first part alone reads as an SSN (9 digits); both together as a card
    assert fields["segments"][0]["text"] == "It is [SSN] levels."
    assert fields["segments"][2]["text"] == "[CARD_NUMBER]"


def test_the_answer_to_a_turn_that_names_an_ssn_is_masked_though_whisper_lost_the_question_mark():
    r = row(
        ("agent", "So may we verify your identity, your social security, not man."),
        ("customer", "It's safe for 8, 2, 6, 3, 1, 5"),
    )
    fields, entities = Redactor(["ssn"]).redact(r)
    assert [e["type"] for e in entities] == ["ssn"] and not leaked(fields, "826315")


def test_a_card_read_with_a_misheard_word_before_a_spoken_separator_is_one_run():
    said = "It's in 4 dash 4 dash 8 dash 0, i dash 9 dash 3 dash 0 4 1 3 6 3 7 2 3 8."
    fields, entities = Redactor(["pci"]).redact(row(("customer", said)))
    assert [e["type"] for e in entities] == ["card_number"] and not leaked(
        fields, "4480930413637238"
    )


def test_years_and_round_numbers_after_an_account_cue_stay():
    for said in (
        "I have had this account for 29 years. I have been a customer since 2015.",
        "I can simply account for 20,000 years.",
        "The account was opened in 2021 with 5,000 dollars.",
    ):
        _, entities = Redactor(["all"]).redact(row(("customer", said)))
        assert not entities, (said, entities)


def test_loops_of_amounts_and_round_numbers_and_order_numbers_outside_a_card_talk_stay():
    for said in (
        "The balance of the account is $1,000, $3,400, $4,500, $5,000, $4,000, $5,000, $4,000.",
        "I won't charge $4,500 by $1,65.15 on my last bill.",
        "We are in room 1,000,000,000,000,000,000,000,000.",
        "Your order have verminates on with 7,000,000,000,000 with 60,000.",
        "Your order number in 400, 2021, 3006.",
        "The confirmation number is 365,000, I'm 120,000, 22.",
        "The balance on the account is 1,7001.51.",
    ):
        _, entities = Redactor(["all"]).redact(row(("agent", said)))
        assert not entities, (said, entities)


def test_the_same_loops_are_masked_in_a_card_talk_after_a_secrets_cue_or_when_luhn_valid():
    looped = "$1,000, $3,400, $4,500, $5,000, $4,000, $5,000, $4,000."
    for turns, secret in (
        ((("agent", "Sure, what is the card number?"), ("customer", looped)), "34004500"),
        (
            (("customer", f"It is {looped}"), ("agent", "And the expiration date?")),
            "34004500",
        ),
        ((("customer", f"The account number is {looped}"),), "34004500"),
        ((("customer", "My social is 1,000,000,000,000,000."),), "1000000"),
        ((("customer", "The order number is 4111 1111 1111 1111."),), "4111111111111111"),
    ):
        fields, entities = Redactor(["all"]).redact(row(*turns))
        assert entities and not leaked(fields, secret), (turns, fields["text"])


def timed_row(*segments: tuple[str, list[tuple[str, float, float]]]) -> dict:
    """A diarized mono call's row: (speaker, [(word, start, end), ...]) a segment, the text
    its dialogue (consecutive segments of one speaker on one line)."""
    segs = [
        {
            "start": words[0][1],
            "end": words[-1][2],
            "text": " ".join(w for w, _, _ in words),
            "channel": 0,
            "speaker": speaker,
            "words": [{"word": w, "start": a, "end": b, "probability": 0.9} for w, a, b in words],
        }
        for speaker, words in segments
    ]
    lines: list[list[str]] = []
    for seg in segs:
        if lines and lines[-1][0] == seg["speaker"]:
            lines[-1].append(seg["text"])
        else:
            lines.append([seg["speaker"], seg["text"]])
    return {"text": "\n".join(f"{s}: {' '.join(x)}" for s, *x in lines), "segments": segs}


def spaced(start: float, *words: str) -> list[tuple[str, float, float]]:
    return [(w, start + 0.4 * i, start + 0.4 * i + 0.3) for i, w in enumerate(words)]


def test_a_number_is_found_over_the_whole_call_whatever_speaker_diarization_gave_its_edge_words():
    # Diarization gives each word the speaker its timestamp falls in; Whisper timed the last
    # digit (zero length) past the customer's turn, so it opens the agent's segment, and the
    # card's first digits went to the agent's question before it.
    r = timed_row(
        ("agent", spaced(0.0, "And", "your", "social", "security", "number?")),
        ("customer", spaced(3.0, "My", "social", "security", "number", "is", "123.")),
        ("customer", spaced(6.0, "4,", "5,", "6,", "7,", "8,")),
        ("agent", [("9.", 9.1, 9.1), *spaced(9.5, "Great,", "the", "payment", "is", "done.")]),
        ("agent", spaced(40.0, "And", "the", "card", "number", "please?", "4532")),
        ("customer", spaced(43.0, "1111", "2222", "3336.")),
        ("customer", spaced(45.0, "Thank", "you.")),
    )
    fields, entities = Redactor(["pci", "ssn"]).redact(r)
    # No digit of either number is left in any segment, text or word.
    for seg in fields["segments"]:
        assert not any(ch.isdigit() for ch in seg["text"]), seg["text"]
        assert not any(ch.isdigit() for w in seg["words"] for ch in w["word"]), seg["words"]
    assert not any(ch.isdigit() for ch in fields["text"]), fields["text"]
    assert [e["type"] for e in entities] == ["ssn", "card_number"]
    assert entities[0]["end_s"] == 9.1 and entities[1]["start_s"] == 42.0
    # One number, one tag on the customer's line; the other speaker's words stay.
    assert fields["text"] == (
        "agent: And your social security number?\n"
        "customer: My social security number is [SSN],\n"
        "agent: [SSN]. Great, the payment is done. And the card number please? [CARD_NUMBER]\n"
        "customer: [CARD_NUMBER]. Thank you."
    )
    assert [s["text"] for s in fields["segments"]][2:4] == [
        "[SSN],",
        "[SSN]. Great, the payment is done.",
    ]

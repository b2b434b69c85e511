"""Telephony: phone calls reach voiceagent through their platform's media stream (Twilio,
Telnyx, Vonage, Asterisk AudioSocket and chan_websocket); a bot drives what is spoken."""
